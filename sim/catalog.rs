//! The hardware and model catalogs (datasheet and HF `config.json` figures).

use serde::{Deserialize, Serialize};

/// Numeric formats of weights and KV cache.
///
/// Floats (`fp32`, `fp16`, `bf16`, `fp8`) serve both; `int8` serves both (weight-only W8A16
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
}

impl Dtype {
    /// Every format, for listings and tests.
    pub const ALL: [Dtype; 15] = [
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
        }
    }

    /// Bytes per element of the embedding and LM head: AWQ, GPTQ and int8 schemes keep
    /// them in 16 bits; GGUF files quantize them too.
    pub fn embedding_bytes(self) -> f64 {
        match self {
            Dtype::Int8 | Dtype::W8a8 | Dtype::Int4 | Dtype::Int4G64 | Dtype::Int4G32 => 2.0,
            d => d.bytes(),
        }
    }

    /// Whether the GEMM dequantizes the weights to 16 bits before multiplying (weight-only
    /// quantization): compute runs at the 16-bit rate, slowed by the unpacking.
    pub fn is_weight_only(self) -> bool {
        !matches!(
            self,
            Dtype::Fp32 | Dtype::Fp16 | Dtype::Bf16 | Dtype::Fp8 | Dtype::W8a8
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
        }
    }
}

/// One GPU model (dense figures from the vendor datasheets).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Gpu {
    /// Catalog key.
    pub name: &'static str,
    /// Marketing name.
    pub display: &'static str,
    /// Device memory in bytes, as `nvidia-smi` reports the total.
    pub mem_bytes: f64,
    /// Dense 16-bit tensor-core peak, FLOP/s.
    pub flops_16: f64,
    /// Dense fp8 peak, FLOP/s (`None`: no fp8 tensor cores; fp8 runs at the 16-bit rate).
    pub flops_fp8: Option<f64>,
    /// Dense fp32 (non-tensor) peak, FLOP/s.
    pub flops_32: f64,
    /// HBM/GDDR bandwidth, bytes/s.
    pub mem_bw: f64,
    /// GPU-to-GPU link bandwidth per GPU and direction used by all-reduce, bytes/s
    /// (NVLink where the part has it, else PCIe).
    pub link_bw: f64,
    /// Host link (PCIe) bandwidth per direction, bytes/s (swap, uploads).
    pub pcie_bw: f64,
    /// Fraction of `link_bw` a ring all-reduce reaches on large messages (NCCL within a
    /// node), fitted to Vidur's profiles where measured.
    pub allreduce_eff: f64,
    /// Fixed cost of one all-reduce, microseconds.
    pub allreduce_latency_us: f64,
    /// Rental price, US dollars per GPU-hour (a rough on-demand cloud figure for capacity
    /// planning; `sim plan --price` overrides it).
    pub price_per_hour: f64,
}

/// A GPU described in a TOML file (`hardware.gpu_file`), in the units of datasheets.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuFile {
    /// Short name.
    pub name: String,
    /// Marketing name (default: the name).
    #[serde(default)]
    pub display: Option<String>,
    /// Device memory, GiB.
    pub memory_gib: f64,
    /// Dense 16-bit tensor-core peak, TFLOP/s.
    pub bf16_tflops: f64,
    /// Dense fp8 peak, TFLOP/s (omit when the GPU has no fp8 tensor cores).
    #[serde(default)]
    pub fp8_tflops: Option<f64>,
    /// fp32 (non-tensor) peak, TFLOP/s.
    pub fp32_tflops: f64,
    /// Memory bandwidth, GB/s.
    pub memory_bandwidth_gbs: f64,
    /// GPU-to-GPU bandwidth per direction for all-reduce (NVLink, else PCIe), GB/s.
    pub interconnect_gbs: f64,
    /// Host link per direction, GB/s.
    pub pcie_gbs: f64,
    /// Fraction of the interconnect an all-reduce reaches (default 0.6).
    #[serde(default)]
    pub allreduce_eff: Option<f64>,
    /// Fixed cost of one all-reduce, microseconds (default 50).
    #[serde(default)]
    pub allreduce_latency_us: Option<f64>,
    /// Rental price, USD per GPU-hour (default 0: unknown).
    #[serde(default)]
    pub price_per_hour: Option<f64>,
}

impl Gpu {
    /// Reads a GPU from a TOML file ([`GpuFile`]'s keys); errors name the file and key.
    pub fn from_toml_file(path: &std::path::Path) -> Result<Gpu, String> {
        let shown = path.display();
        let text = std::fs::read_to_string(path).map_err(|e| format!("{shown}: {e}"))?;
        let f: GpuFile = toml::from_str(&text).map_err(|e| format!("{shown}: {}", e.message()))?;
        let positive = [
            ("memory_gib", f.memory_gib),
            ("bf16_tflops", f.bf16_tflops),
            ("fp32_tflops", f.fp32_tflops),
            ("memory_bandwidth_gbs", f.memory_bandwidth_gbs),
            ("interconnect_gbs", f.interconnect_gbs),
            ("pcie_gbs", f.pcie_gbs),
            ("fp8_tflops", f.fp8_tflops.unwrap_or(1.0)),
        ];
        for (k, v) in positive {
            if !(v > 0.0 && v.is_finite()) {
                return Err(format!("{shown}: `{k}` must be a positive number, got {v}"));
            }
        }
        if let Some(e) = f.allreduce_eff {
            if !(e > 0.0 && e <= 1.0) {
                return Err(format!(
                    "{shown}: `allreduce_eff` must be in (0, 1], got {e}"
                ));
            }
        }
        if let Some(l) = f.allreduce_latency_us {
            if !(l >= 0.0 && l.is_finite()) {
                return Err(format!(
                    "{shown}: `allreduce_latency_us` must be a non-negative number, got {l}"
                ));
            }
        }
        if let Some(p) = f.price_per_hour {
            if !(p >= 0.0 && p.is_finite()) {
                return Err(format!(
                    "{shown}: `price_per_hour` must be a non-negative number, got {p}"
                ));
            }
        }
        let display = f.display.clone().unwrap_or_else(|| f.name.clone());
        Ok(Gpu {
            // Read once per process (`gpu_from_file`), like the catalog's static entries.
            name: Box::leak(f.name.into_boxed_str()),
            display: Box::leak(display.into_boxed_str()),
            mem_bytes: f.memory_gib * 1024.0 * MIB,
            flops_16: f.bf16_tflops * 1e12,
            flops_fp8: f.fp8_tflops.map(|t| t * 1e12),
            flops_32: f.fp32_tflops * 1e12,
            mem_bw: f.memory_bandwidth_gbs * 1e9,
            link_bw: f.interconnect_gbs * 1e9,
            pcie_bw: f.pcie_gbs * 1e9,
            allreduce_eff: f.allreduce_eff.unwrap_or(0.6),
            allreduce_latency_us: f.allreduce_latency_us.unwrap_or(50.0),
            price_per_hour: f.price_per_hour.unwrap_or(0.0),
        })
    }

    /// Peak FLOP/s for matrix math in `dtype`.
    pub fn peak_flops(&self, dtype: Dtype) -> f64 {
        match dtype {
            Dtype::Fp32 => self.flops_32,
            Dtype::Fp8 => self.flops_fp8.unwrap_or(self.flops_16),
            // int8 tensor cores: twice the 16-bit rate on Ampere, Ada and Hopper.
            Dtype::W8a8 => 2.0 * self.flops_16,
            // Weight-only formats multiply in 16 bits after dequantizing.
            _ => self.flops_16,
        }
    }
}

const MIB: f64 = 1024.0 * 1024.0;

/// The GPU catalog.
pub const GPUS: &[Gpu] = &[
    Gpu {
        name: "a100-40gb",
        display: "NVIDIA A100-SXM4-40GB",
        mem_bytes: 40960.0 * MIB,
        flops_16: 312e12,
        flops_fp8: None,
        flops_32: 19.5e12,
        mem_bw: 1.555e12,
        link_bw: 300e9,
        pcie_bw: 32e9,
        allreduce_eff: 0.6,
        allreduce_latency_us: 50.0,
        price_per_hour: 1.3,
    },
    Gpu {
        name: "a100-80gb",
        display: "NVIDIA A100-SXM4-80GB",
        mem_bytes: 81920.0 * MIB,
        flops_16: 312e12,
        flops_fp8: None,
        flops_32: 19.5e12,
        mem_bw: 2.039e12,
        link_bw: 300e9,
        pcie_bw: 32e9,
        allreduce_eff: 0.6,
        allreduce_latency_us: 50.0,
        price_per_hour: 1.8,
    },
    Gpu {
        name: "a100-80gb-pcie",
        display: "NVIDIA A100 80GB PCIe",
        mem_bytes: 81920.0 * MIB,
        flops_16: 312e12,
        flops_fp8: None,
        flops_32: 19.5e12,
        mem_bw: 1.935e12,
        link_bw: 32e9,
        pcie_bw: 32e9,
        allreduce_eff: 0.6,
        allreduce_latency_us: 50.0,
        price_per_hour: 1.6,
    },
    Gpu {
        name: "h100-sxm",
        display: "NVIDIA H100 80GB HBM3 (SXM5)",
        mem_bytes: 81559.0 * MIB,
        flops_16: 989.4e12,
        flops_fp8: Some(1978.9e12),
        flops_32: 66.9e12,
        mem_bw: 3.35e12,
        link_bw: 450e9,
        pcie_bw: 64e9,
        allreduce_eff: 0.8,
        allreduce_latency_us: 30.0,
        price_per_hour: 3.0,
    },
    Gpu {
        name: "h100-pcie",
        display: "NVIDIA H100 PCIe",
        mem_bytes: 81559.0 * MIB,
        flops_16: 756.5e12,
        flops_fp8: Some(1513e12),
        flops_32: 51.2e12,
        mem_bw: 2.0e12,
        link_bw: 64e9,
        pcie_bw: 64e9,
        allreduce_eff: 0.6,
        allreduce_latency_us: 50.0,
        price_per_hour: 2.5,
    },
    Gpu {
        name: "h200",
        display: "NVIDIA H200 (SXM, 141 GB HBM3e)",
        mem_bytes: 143771.0 * MIB,
        flops_16: 989.4e12,
        flops_fp8: Some(1978.9e12),
        flops_32: 66.9e12,
        mem_bw: 4.8e12,
        link_bw: 450e9,
        pcie_bw: 64e9,
        allreduce_eff: 0.8,
        allreduce_latency_us: 30.0,
        price_per_hour: 3.8,
    },
    Gpu {
        name: "l40s",
        display: "NVIDIA L40S",
        mem_bytes: 46068.0 * MIB,
        flops_16: 362.05e12,
        flops_fp8: Some(733e12),
        flops_32: 91.6e12,
        mem_bw: 0.864e12,
        link_bw: 32e9,
        pcie_bw: 32e9,
        allreduce_eff: 0.6,
        allreduce_latency_us: 50.0,
        price_per_hour: 1.0,
    },
];

/// A transformer shape (Llama family: RMSNorm, RoPE, GQA, SwiGLU).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSpec {
    /// Catalog key.
    pub name: &'static str,
    /// Hugging Face repository it describes.
    pub hf_id: &'static str,
    /// Decoder layers.
    pub layers: u32,
    /// Hidden size.
    pub hidden: u32,
    /// Attention (query) heads.
    pub heads: u32,
    /// Key/value heads (GQA when fewer than `heads`).
    pub kv_heads: u32,
    /// Head dimension.
    pub head_dim: u32,
    /// MLP intermediate size.
    pub intermediate: u32,
    /// Vocabulary size.
    pub vocab: u32,
    /// Context length the model was trained for (default `max_model_len`).
    pub max_position: u32,
    /// Whether the LM head shares the embedding matrix.
    pub tied_embeddings: bool,
    /// RoPE base frequency (`rope_theta`).
    pub rope_theta: f32,
    /// Sliding attention window in tokens (`sliding_window` of the HF config; `None`: full
    /// attention).
    pub sliding_window: Option<u32>,
    /// Experts per MoE layer (1: a dense MLP).
    pub num_experts: u32,
    /// Experts each token is routed to (top-k).
    pub experts_per_token: u32,
}

impl ModelSpec {
    /// Reads a Hugging Face `config.json` (Llama, Mistral, Mixtral, Qwen2 and other
    /// Llama-like architectures): `num_hidden_layers`, `hidden_size`,
    /// `num_attention_heads`, `intermediate_size` and `vocab_size` are required;
    /// `num_key_value_heads` (default: the heads), `head_dim` (default: hidden / heads),
    /// `max_position_embeddings` (default 4096), `tie_word_embeddings`, `rope_theta`
    /// (default 10000), `sliding_window` (ignored when `use_sliding_window` is false) and
    /// the experts (`num_local_experts` or `num_experts`, with `num_experts_per_tok`) are
    /// read when present. Errors name the file and the key.
    pub fn from_hf_config(path: &std::path::Path) -> Result<ModelSpec, String> {
        let shown = path.display();
        let text = std::fs::read_to_string(path).map_err(|e| format!("{shown}: {e}"))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{shown}: not JSON: {e}"))?;
        let num = |key: &str| -> Result<Option<u32>, String> {
            match v.get(key) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(x) => x
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .map(Some)
                    .ok_or_else(|| {
                        format!("{shown}: `{key}` must be a non-negative integer, got {x}")
                    }),
            }
        };
        let need = |key: &str| -> Result<u32, String> {
            match num(key)? {
                Some(n) if n > 0 => Ok(n),
                Some(_) => Err(format!("{shown}: `{key}` must be positive")),
                None => Err(format!("{shown}: missing `{key}`")),
            }
        };
        let hidden = need("hidden_size")?;
        let heads = need("num_attention_heads")?;
        let kv_heads = num("num_key_value_heads")?.unwrap_or(heads).max(1);
        if heads % kv_heads != 0 {
            return Err(format!(
                "{shown}: `num_attention_heads` ({heads}) is not a multiple of `num_key_value_heads` ({kv_heads})"
            ));
        }
        let head_dim = match num("head_dim")? {
            Some(d) if d > 0 => d,
            _ if hidden % heads == 0 => hidden / heads,
            _ => {
                return Err(format!(
                    "{shown}: `hidden_size` ({hidden}) is not a multiple of `num_attention_heads` ({heads}); give `head_dim`"
                ))
            }
        };
        let num_experts = match (num("num_local_experts")?, num("num_experts")?) {
            (Some(e), _) | (None, Some(e)) => e.max(1),
            (None, None) => 1,
        };
        if num("shared_expert_intermediate_size")?.is_some_and(|n| n > 0) {
            return Err(format!(
                "{shown}: shared experts (`shared_expert_intermediate_size`, Qwen-MoE) are not modelled yet"
            ));
        }
        // Qwen-MoE sizes its experts with `moe_intermediate_size`; Mixtral with
        // `intermediate_size`.
        let intermediate = match num("moe_intermediate_size")? {
            Some(n) if n > 0 && num_experts > 1 => n,
            _ => need("intermediate_size")?,
        };
        let experts_per_token = num("num_experts_per_tok")?
            .unwrap_or(1)
            .clamp(1, num_experts);
        let uses_window = v.get("use_sliding_window").and_then(|x| x.as_bool()) != Some(false);
        let name = v
            .get("_name_or_path")
            .and_then(|x| x.as_str())
            .filter(|s| !s.is_empty())
            .map_or_else(|| shown.to_string(), str::to_string);
        Ok(ModelSpec {
            // Read once per process (`model_from_file`), like the catalog's static entries.
            name: Box::leak(name.clone().into_boxed_str()),
            hf_id: Box::leak(name.into_boxed_str()),
            layers: need("num_hidden_layers")?,
            hidden,
            heads,
            kv_heads,
            head_dim,
            intermediate,
            vocab: need("vocab_size")?,
            max_position: num("max_position_embeddings")?.unwrap_or(4096).max(1),
            tied_embeddings: v
                .get("tie_word_embeddings")
                .and_then(|x| x.as_bool())
                .unwrap_or(false),
            rope_theta: v
                .get("rope_theta")
                .and_then(|x| x.as_f64())
                .unwrap_or(10000.0) as f32,
            // A window of 0 (or none) means full attention.
            sliding_window: if uses_window {
                num("sliding_window")?.filter(|&w| w > 0)
            } else {
                None
            },
            num_experts,
            experts_per_token,
        })
    }

    /// Reads the metadata of a GGUF Llama model (`general.architecture = llama`): the
    /// shape through [`kernels::cuda::gguf_shape`], `llama.context_length` (default 4096)
    /// and the name. Errors name the file.
    pub fn from_gguf(path: &std::path::Path) -> Result<ModelSpec, String> {
        let g = kernels::gguf::Gguf::open(path).map_err(|e| e.to_string())?;
        let s = kernels::cuda::gguf_shape(&g).map_err(|e| e.to_string())?;
        let name = g
            .metadata
            .get("general.name")
            .and_then(kernels::gguf::Value::as_str)
            .filter(|n| !n.is_empty())
            .map_or_else(|| path.display().to_string(), str::to_string);
        Ok(ModelSpec {
            // Read once per process (`model_from_gguf`), like the catalog's static entries.
            name: Box::leak(name.clone().into_boxed_str()),
            hf_id: Box::leak(name.into_boxed_str()),
            layers: s.layers,
            hidden: s.hidden,
            heads: s.heads,
            kv_heads: s.kv_heads,
            head_dim: s.head_dim,
            intermediate: s.intermediate,
            vocab: s.vocab,
            max_position: g.meta_u32("llama.context_length").unwrap_or(4096).max(1),
            tied_embeddings: s.tied_embeddings,
            rope_theta: s.rope_theta,
            sliding_window: None,
            num_experts: 1,
            experts_per_token: 1,
        })
    }

    /// The shape the real runtimes need (Llama architecture, RMSNorm epsilon 1e-5).
    pub fn llama_shape(&self) -> kernels::cuda::LlamaShape {
        kernels::cuda::LlamaShape {
            layers: self.layers,
            hidden: self.hidden,
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            intermediate: self.intermediate,
            vocab: self.vocab,
            rope_theta: self.rope_theta,
            rms_eps: 1e-5,
            tied_embeddings: self.tied_embeddings,
            rope_interleaved: false,
        }
    }

    /// Parameters of one decoder layer's linear layers (every expert, and the router of a
    /// mixture of experts).
    pub fn layer_linear_params(&self) -> f64 {
        self.attention_params() + self.mlp_params()
    }

    /// Parameters of one layer's attention projections (Q, K, V, O).
    pub fn attention_params(&self) -> f64 {
        let h = f64::from(self.hidden);
        let q = f64::from(self.heads * self.head_dim);
        let kv = f64::from(self.kv_heads * self.head_dim);
        h * (q + 2.0 * kv) + q * h
    }

    /// Parameters of one layer's MLP: every expert's gate, up and down projections, plus
    /// the router when there are several experts.
    pub fn mlp_params(&self) -> f64 {
        let h = f64::from(self.hidden);
        let e = f64::from(self.num_experts.max(1));
        let router = if self.num_experts > 1 { h * e } else { 0.0 };
        e * 3.0 * h * f64::from(self.intermediate) + router
    }

    /// Whether the MLP is a mixture of experts.
    pub fn is_moe(&self) -> bool {
        self.num_experts > 1
    }

    /// Parameters a token uses: the attention, its `experts_per_token` experts, the
    /// embeddings (Mixtral-8x7B: 12.9B of 46.7B).
    pub fn active_params(&self) -> f64 {
        let h = f64::from(self.hidden);
        let k = f64::from(self.experts_per_token.max(1).min(self.num_experts.max(1)));
        let heads = if self.tied_embeddings { 1.0 } else { 2.0 };
        f64::from(self.layers)
            * (self.attention_params() + k * 3.0 * h * f64::from(self.intermediate))
            + heads * self.embedding_params()
    }

    /// Parameters of the embedding (and of the LM head when untied).
    pub fn embedding_params(&self) -> f64 {
        f64::from(self.vocab) * f64::from(self.hidden)
    }

    /// Total parameters (norm weights included).
    pub fn params(&self) -> f64 {
        let norms = f64::from(self.hidden) * f64::from(2 * self.layers + 1);
        let heads = if self.tied_embeddings { 1.0 } else { 2.0 };
        f64::from(self.layers) * self.layer_linear_params()
            + heads * self.embedding_params()
            + norms
    }
}

/// Files already read by [`model_from_file`] and [`gpu_from_file`]: a scenario's variants
/// and `sim plan`'s probes resolve the same file many times; it is read (and its strings
/// kept for the process) once.
type FileCache<T> = std::sync::Mutex<std::collections::HashMap<std::path::PathBuf, &'static T>>;

fn cached<T>(
    cache: &'static std::sync::OnceLock<FileCache<T>>,
    path: &std::path::Path,
    load: impl FnOnce(&std::path::Path) -> Result<T, String>,
) -> Result<&'static T, String> {
    let map = cache.get_or_init(Default::default);
    let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut map = map
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(&t) = map.get(&key) {
        return Ok(t);
    }
    let t: &'static T = Box::leak(Box::new(load(path)?));
    map.insert(key, t);
    Ok(t)
}

/// A model from a Hugging Face `config.json` ([`ModelSpec::from_hf_config`]), read once.
pub fn model_from_file(path: &std::path::Path) -> Result<&'static ModelSpec, String> {
    static CACHE: std::sync::OnceLock<FileCache<ModelSpec>> = std::sync::OnceLock::new();
    cached(&CACHE, path, ModelSpec::from_hf_config)
}

/// A model from a GGUF file's metadata ([`ModelSpec::from_gguf`]), read once.
pub fn model_from_gguf(path: &std::path::Path) -> Result<&'static ModelSpec, String> {
    static CACHE: std::sync::OnceLock<FileCache<ModelSpec>> = std::sync::OnceLock::new();
    cached(&CACHE, path, ModelSpec::from_gguf)
}

/// A GPU from a TOML file ([`Gpu::from_toml_file`]), read once.
pub fn gpu_from_file(path: &std::path::Path) -> Result<&'static Gpu, String> {
    static CACHE: std::sync::OnceLock<FileCache<Gpu>> = std::sync::OnceLock::new();
    cached(&CACHE, path, Gpu::from_toml_file)
}

/// The model catalog (figures from each model's `config.json`).
pub const MODELS: &[ModelSpec] = &[
    ModelSpec {
        name: "llama-2-7b",
        hf_id: "meta-llama/Llama-2-7b-hf",
        layers: 32,
        hidden: 4096,
        heads: 32,
        kv_heads: 32,
        head_dim: 128,
        intermediate: 11008,
        vocab: 32000,
        max_position: 4096,
        rope_theta: 10000.0,
        sliding_window: None,
        num_experts: 1,
        experts_per_token: 1,
        tied_embeddings: false,
    },
    ModelSpec {
        name: "llama-2-13b",
        hf_id: "meta-llama/Llama-2-13b-hf",
        layers: 40,
        hidden: 5120,
        heads: 40,
        kv_heads: 40,
        head_dim: 128,
        intermediate: 13824,
        vocab: 32000,
        max_position: 4096,
        rope_theta: 10000.0,
        sliding_window: None,
        num_experts: 1,
        experts_per_token: 1,
        tied_embeddings: false,
    },
    ModelSpec {
        name: "llama-2-70b",
        hf_id: "meta-llama/Llama-2-70b-hf",
        layers: 80,
        hidden: 8192,
        heads: 64,
        kv_heads: 8,
        head_dim: 128,
        intermediate: 28672,
        vocab: 32000,
        max_position: 4096,
        rope_theta: 10000.0,
        sliding_window: None,
        num_experts: 1,
        experts_per_token: 1,
        tied_embeddings: false,
    },
    ModelSpec {
        name: "llama-3-8b",
        hf_id: "meta-llama/Meta-Llama-3-8B",
        layers: 32,
        hidden: 4096,
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        intermediate: 14336,
        vocab: 128256,
        max_position: 8192,
        rope_theta: 500000.0,
        sliding_window: None,
        num_experts: 1,
        experts_per_token: 1,
        tied_embeddings: false,
    },
    ModelSpec {
        name: "llama-3-70b",
        hf_id: "meta-llama/Meta-Llama-3-70B",
        layers: 80,
        hidden: 8192,
        heads: 64,
        kv_heads: 8,
        head_dim: 128,
        intermediate: 28672,
        vocab: 128256,
        max_position: 8192,
        rope_theta: 500000.0,
        sliding_window: None,
        num_experts: 1,
        experts_per_token: 1,
        tied_embeddings: false,
    },
    ModelSpec {
        // The usual draft model of speculative decoding for Llama 3 targets (same
        // tokenizer).
        name: "llama-3.2-1b",
        hf_id: "meta-llama/Llama-3.2-1B",
        layers: 16,
        hidden: 2048,
        heads: 32,
        kv_heads: 8,
        head_dim: 64,
        intermediate: 8192,
        vocab: 128256,
        max_position: 131072,
        rope_theta: 500000.0,
        sliding_window: None,
        num_experts: 1,
        experts_per_token: 1,
        tied_embeddings: true,
    },
    ModelSpec {
        name: "mistral-7b",
        hf_id: "mistralai/Mistral-7B-v0.1",
        layers: 32,
        hidden: 4096,
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        intermediate: 14336,
        vocab: 32000,
        max_position: 32768,
        rope_theta: 10000.0,
        sliding_window: Some(4096),
        num_experts: 1,
        experts_per_token: 1,
        tied_embeddings: false,
    },
    ModelSpec {
        name: "smollm2-135m",
        hf_id: "HuggingFaceTB/SmolLM2-135M-Instruct",
        layers: 30,
        hidden: 576,
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
        intermediate: 1536,
        vocab: 49152,
        max_position: 8192,
        rope_theta: 100000.0,
        sliding_window: None,
        num_experts: 1,
        experts_per_token: 1,
        tied_embeddings: true,
    },
    ModelSpec {
        name: "mixtral-8x7b",
        hf_id: "mistralai/Mixtral-8x7B-v0.1",
        layers: 32,
        hidden: 4096,
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        intermediate: 14336,
        vocab: 32000,
        max_position: 32768,
        rope_theta: 1000000.0,
        tied_embeddings: false,
        sliding_window: None,
        num_experts: 8,
        experts_per_token: 2,
    },
    ModelSpec {
        name: "qwen2-72b",
        hf_id: "Qwen/Qwen2-72B",
        layers: 80,
        hidden: 8192,
        heads: 64,
        kv_heads: 8,
        head_dim: 128,
        intermediate: 29568,
        vocab: 152064,
        max_position: 32768,
        rope_theta: 1000000.0,
        tied_embeddings: false,
        sliding_window: None,
        num_experts: 1,
        experts_per_token: 1,
    },
];

/// Normalises a user-typed name: lower case, `_`, space and `.` become `-`.
fn normalise(name: &str) -> String {
    name.trim()
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c == '_' || c == ' ' { '-' } else { c })
        .collect()
}

/// The catalog GPU of a CUDA device name (`NVIDIA H100 80GB HBM3` is `h100-sxm`), when
/// the name says which.
pub fn gpu_for_device(device: &str) -> Option<&'static str> {
    let d = device.to_ascii_lowercase();
    let pcie = d.contains("pcie");
    if d.contains("h200") {
        Some("h200")
    } else if d.contains("h100") {
        Some(if pcie { "h100-pcie" } else { "h100-sxm" })
    } else if d.contains("a100") && d.contains("80") {
        Some(if pcie { "a100-80gb-pcie" } else { "a100-80gb" })
    } else if d.contains("a100") {
        Some("a100-40gb")
    } else if d.contains("l40s") {
        Some("l40s")
    } else {
        None
    }
}

/// Looks up a GPU by catalog key (case-insensitive; `h100` means `h100-sxm`,
/// `a100` means `a100-80gb`).
pub fn find_gpu(name: &str) -> Option<&'static Gpu> {
    let n = normalise(name);
    let n = match n.as_str() {
        "h100" | "h100-80gb" | "h100-sxm5" => "h100-sxm",
        "a100" | "a100-80gb-sxm" => "a100-80gb",
        "a100-40gb-sxm" => "a100-40gb",
        "h200-sxm" => "h200",
        other => other,
    };
    GPUS.iter().find(|g| g.name == n)
}

/// Looks up a model by catalog key or Hugging Face id (case-insensitive).
pub fn find_model(name: &str) -> Option<&'static ModelSpec> {
    let n = normalise(name);
    MODELS
        .iter()
        .find(|m| m.name == n || normalise(m.hf_id) == n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama2_70b_is_about_69b_params() {
        let m = find_model("Llama-2-70B").unwrap();
        // 68.98e9 with the HF shapes above (the "70B" is rounded).
        assert!((m.params() / 1e9 - 68.98).abs() < 0.05, "{}", m.params());
    }

    #[test]
    fn llama3_8b_params() {
        let m = find_model("meta-llama/Meta-Llama-3-8B").unwrap();
        assert!((m.params() / 1e9 - 8.03).abs() < 0.01, "{}", m.params());
    }

    #[test]
    fn smollm2_params() {
        let m = find_model("smollm2-135m").unwrap();
        assert!((m.params() / 1e6 - 134.5).abs() < 0.5, "{}", m.params());
    }

    #[test]
    fn aliases() {
        assert_eq!(find_gpu("H100").unwrap().name, "h100-sxm");
        assert_eq!(find_gpu("A100_40GB").unwrap().name, "a100-40gb");
        assert!(find_gpu("tpu-v5").is_none());
    }
}
