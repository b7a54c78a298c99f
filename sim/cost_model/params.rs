//! The cost model's parameters ([`CostParams`], a scenario's `[cost]` table): efficiency
//! factors of each operator family against the GPU's peaks, the serving framework whose CPU
//! overheads apply, and overrides of each. Defaults and what they were fitted to are in
//! VALIDATION.md; `sim calibrate` writes files of these keys.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Framework;
use crate::catalog::Dtype;

/// The format of a mixture of experts' routed experts, as `[cost.by_gpu.<gpu>.experts.<format>]`
/// names it: each runs its own grouped-GEMM kernels (vLLM's block-fp8 Triton MoE and its
/// Marlin MXFP4 MoE on a Hopper; TensorRT-LLM's fp8 and NVFP4 CUTLASS MoE on a Blackwell).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ExpertFormat {
    /// 16- or 32-bit floats (`bf16`, `fp16`, `fp32`).
    Bf16,
    /// fp8, per tensor or block-scaled (`fp8`, `fp8-block`).
    Fp8,
    /// 4-bit floats (`nvfp4`, `mxfp4`).
    Fp4,
    /// Integer formats (`int8`, `w8a8`, AWQ/GPTQ `int4`, GGUF blocks).
    Int,
}

impl ExpertFormat {
    /// Every format, in the order files list them.
    pub const ALL: [ExpertFormat; 4] = [
        ExpertFormat::Bf16,
        ExpertFormat::Fp8,
        ExpertFormat::Fp4,
        ExpertFormat::Int,
    ];

    /// The format a file names (`fp8`), if any.
    pub fn from_name(name: &str) -> Option<ExpertFormat> {
        ExpertFormat::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The family of the weight format `dtype`.
    pub fn of(dtype: Dtype) -> ExpertFormat {
        match dtype {
            Dtype::Fp32 | Dtype::Fp16 | Dtype::Bf16 => ExpertFormat::Bf16,
            Dtype::Fp8 | Dtype::Fp8Block => ExpertFormat::Fp8,
            Dtype::Nvfp4 | Dtype::Mxfp4 => ExpertFormat::Fp4,
            Dtype::Int8
            | Dtype::W8a8
            | Dtype::Int4
            | Dtype::Int4G64
            | Dtype::Int4G32
            | Dtype::Q4_0
            | Dtype::Q4_1
            | Dtype::Q5K
            | Dtype::Q8_0
            | Dtype::Q4KM
            | Dtype::Q6K => ExpertFormat::Int,
        }
    }

    /// Its name in a file (`fp8`).
    pub fn name(self) -> &'static str {
        match self {
            ExpertFormat::Bf16 => "bf16",
            ExpertFormat::Fp8 => "fp8",
            ExpertFormat::Fp4 => "fp4",
            ExpertFormat::Int => "int",
        }
    }
}

/// The shape of a mixture of experts' routed experts' GEMMs, as
/// `[cost.by_gpu.<gpu>.experts.<format>.shapes.<hidden>x<intermediate>]` names it: the model's
/// hidden size by each expert's intermediate size (DeepSeek-V3/R1 and Kimi-K2 `7168x2048`,
/// Qwen3-235B-A22B `4096x1536`, gpt-oss-120b `2880x2880`). An engine's grouped-GEMM kernels
/// pick their tiles, and reach their fraction of the peaks, by these dimensions (aiconfigurator
/// profiles its MoE kernels per model shape for the same reason), so an engine's terms are
/// fitted per GPU, format and shape, and a model of a shape already fitted takes its terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ExpertShape {
    /// The model's hidden size (`hidden_size`).
    pub hidden: u32,
    /// Each routed expert's intermediate size (`moe_intermediate_size`).
    pub intermediate: u32,
}

impl ExpertShape {
    /// The routed experts' shape of `model` (`None`: a dense model).
    pub fn of(model: &crate::catalog::ModelSpec) -> Option<ExpertShape> {
        (model.num_experts > 1).then_some(ExpertShape {
            hidden: model.hidden,
            intermediate: model.intermediate,
        })
    }

    /// The shape a file names (`7168x2048`), if it is one: two positive integers joined by
    /// `x`, in digits without a leading zero.
    pub fn from_name(name: &str) -> Option<ExpertShape> {
        let (h, i) = name.split_once('x')?;
        // Digits only, no leading zero: the name a file gives must be the one `name` makes,
        // which is what a deployment's shape is looked up by.
        let dim = |s: &str| {
            s.parse::<u32>()
                .ok()
                .filter(|&v| v > 0 && !s.starts_with('0') && s.bytes().all(|b| b.is_ascii_digit()))
        };
        Some(ExpertShape {
            hidden: dim(h)?,
            intermediate: dim(i)?,
        })
    }

    /// Its name in a file (`7168x2048`).
    pub fn name(self) -> String {
        format!("{}x{}", self.hidden, self.intermediate)
    }
}

/// An engine's expert kernels on one GPU for one expert format
/// (`[cost.by_gpu.<gpu>.experts.<format>]`), over the GPU's own terms and the table's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpertCost {
    /// `moe_gemm_eff` for experts in this format on this GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_gemm_eff: Option<f64>,
    /// `moe_compute_eff` for experts in this format on this GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_compute_eff: Option<f64>,
    /// `moe_prefill_expert_us` for experts in this format on this GPU, microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_prefill_expert_us: Option<f64>,
    /// The terms for one [`ExpertShape`] of experts in this format on this GPU, over the
    /// three above, by the shape's name (`[cost.by_gpu.b200.experts.fp8.shapes.7168x2048]`).
    /// Keyed by name, so that an error in an entry names it; [`CostParams::validate`]
    /// rejects a name that is no shape, and an entry with shapes of its own.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub shapes: BTreeMap<String, ExpertCost>,
}

impl ExpertCost {
    /// Applies the terms it sets to `p`, then those of `shape`'s entry, if any.
    fn apply_shaped(&self, p: &mut CostParams, shape: Option<ExpertShape>) {
        self.apply(p);
        if let Some(e) = shape.and_then(|s| self.shapes.get(&s.name())) {
            e.apply(p);
        }
    }

    /// Applies the terms it sets to `p` (not its shapes').
    fn apply(&self, p: &mut CostParams) {
        if let Some(e) = self.moe_gemm_eff {
            p.moe_gemm_eff = e;
        }
        if self.moe_compute_eff.is_some() {
            p.moe_compute_eff = self.moe_compute_eff;
        }
        if let Some(us) = self.moe_prefill_expert_us {
            p.moe_prefill_expert_us = us;
        }
    }
}

/// Efficiencies (and the experts' prefill floor) that hold on one GPU only
/// (`[cost.by_gpu.<gpu>]`), over the `[cost]` table's: an engine's kernels reach a different
/// fraction of a Blackwell's peaks than of a Hopper's (its fp8 GEMMs, its all-reduce), so a
/// calibration fitted on several GPUs keeps them per GPU; `experts` narrows the MoE terms to
/// one expert format. `None`: the `[cost]` table's value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuCost {
    /// `gemm_compute_eff` on this GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm_compute_eff: Option<f64>,
    /// `fp8_compute_eff` on this GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp8_compute_eff: Option<f64>,
    /// `fp4_compute_eff` on this GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp4_compute_eff: Option<f64>,
    /// `fp8_memory_eff` on this GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp8_memory_eff: Option<f64>,
    /// `fp4_memory_eff` on this GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp4_memory_eff: Option<f64>,
    /// `allreduce_eff` on this GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allreduce_eff: Option<f64>,
    /// `eager_layer_us` on this GPU, microseconds: the host's time to launch a layer
    /// outside CUDA graphs is the host's, and each GPU's deployments run on hosts of their
    /// own (a floor set here applies even where `[cost]` sets none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eager_layer_us: Option<f64>,
    /// `moe_gemm_eff` on this GPU (an engine's own expert kernels there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_gemm_eff: Option<f64>,
    /// `moe_compute_eff` on this GPU (the compute side of an engine's expert kernels
    /// there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_compute_eff: Option<f64>,
    /// `moe_prefill_expert_us` on this GPU (an engine's own expert kernels' floor in a
    /// prefill there), microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_prefill_expert_us: Option<f64>,
    /// The expert kernels' terms for one expert format on this GPU, over the three above,
    /// by [`ExpertFormat`] name (`[cost.by_gpu.h200.experts.fp8] moe_gemm_eff = 0.45`): an
    /// engine's fp8 and fp4 experts run different kernels (and each format's entry may part
    /// by the experts' shape, [`ExpertCost::shapes`]). Keyed by name, so that an error
    /// in an entry names it; [`CostParams::validate`] rejects a name that is no format.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub experts: BTreeMap<String, ExpertCost>,
}

impl GpuCost {
    /// The efficiencies it sets, with their values (`("fp8_compute_eff", 0.5)`).
    fn keys(&self) -> impl Iterator<Item = (&'static str, f64)> {
        [
            ("gemm_compute_eff", self.gemm_compute_eff),
            ("fp8_compute_eff", self.fp8_compute_eff),
            ("fp4_compute_eff", self.fp4_compute_eff),
            ("fp8_memory_eff", self.fp8_memory_eff),
            ("fp4_memory_eff", self.fp4_memory_eff),
            ("allreduce_eff", self.allreduce_eff),
            ("moe_gemm_eff", self.moe_gemm_eff),
            ("moe_compute_eff", self.moe_compute_eff),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
    }
}

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
    /// Host time per layer of a step that runs outside CUDA graphs, microseconds: a step
    /// that prefills (vLLM above its graphs' token sizes, TensorRT-LLM's context phase,
    /// SGLang's extend) has its kernels launched one by one from Python, and lasts at
    /// least `layers x this` however little its GPUs compute (default 0: not modelled;
    /// `sim calibrate --observed` fits it per engine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eager_layer_us: Option<f64>,
    /// The most tokens (and sampled draws) a step replays in a CUDA graph: a decode step of
    /// more runs its kernels eagerly too, so the `eager_layer_us` floor applies to it as to
    /// a step that prefills (vLLM: `max_cudagraph_capture_size`, 512 by default; this
    /// project's CUDA runtime: 8). Default: every decode step runs in a graph.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph_max_tokens: Option<u32>,
    /// Fraction of the link bandwidth an all-reduce reaches (default: the GPU's,
    /// fitted to Vidur's NCCL profiles: 0.6 on A100 DGX, 0.8 on H100 DGX).
    pub allreduce_eff: Option<f64>,
    /// Latency of one all-reduce, microseconds (default: the GPU's, 50 on A100 DGX, 30
    /// on H100 DGX; the custom kernel's 10 us for its small messages); on the custom
    /// kernel it is a pair's, and `allreduce_peer_us` is added per GPU beyond.
    pub allreduce_latency_us: Option<f64>,
    /// Overlap of compute and memory time in one kernel: `None` is the plain roofline
    /// `max(t_compute, t_memory)`; `Some(p)` is the soft maximum `(t_c^p + t_m^p)^(1/p)`,
    /// slower near the ridge point where neither bound hides the other (p = 1.5 fits
    /// Vidur's GEMM profiles).
    pub overlap_exponent: Option<f64>,
    /// Use the framework's own all-reduce kernel for messages up to 8 MiB (vLLM's and
    /// TensorRT-LLM's custom all-reduce over NVLink: ~10 us a pair instead of NCCL's fixed
    /// cost); default: whether the framework has one and the group is peer-to-peer within
    /// 8 GPUs.
    pub custom_allreduce: Option<bool>,
    /// What a custom (one-shot) all-reduce costs per GPU beyond a pair, microseconds: each
    /// rank reads every peer's buffer and waits on every peer's flag, so the kernel's fixed
    /// cost grows with the tensor-parallel degree (the framework's latency is a pair's; TP8
    /// pays six times this on top). The default is `sim calibrate --observed`'s fit to
    /// aiconfigurator's dense deployments above TP2 (`calibration/allreduce-peer.toml`).
    pub allreduce_peer_us: f64,
    /// Framework CPU overhead per step, microseconds (scheduling, input preparation;
    /// default: the framework's).
    pub step_overhead_us: Option<f64>,
    /// Additional CPU overhead per sequence in the step, microseconds (default: the
    /// framework's).
    pub per_seq_overhead_us: Option<f64>,
    /// The engine's front end per request, milliseconds: API server, tokenizer and
    /// scheduling before a request reaches the scheduler, which no step accounts for. The
    /// request is enqueued this long after it is sent; its latencies count from the send,
    /// as a benchmark client measures them (default 0: none modelled).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_overhead_ms: Option<f64>,
    /// The front end's serial time per request, milliseconds: the part of its work one
    /// process does for one request at a time (parsing, tokenizing, handing the request
    /// to the scheduler), so requests queue for it when they come faster than it serves
    /// them. Served first come first served with [`Self::frontend_update_us`]'s work, before
    /// `request_overhead_ms`'s delay (default 0: none modelled).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frontend_request_ms: Option<f64>,
    /// The front end's serial time per streamed update, microseconds: each sequence that
    /// produced output in a step is one update (detokenizing, one server-sent event) that
    /// the same process serves first come first served, so a client sees a step's tokens
    /// when the front end has sent them. An API server that cannot keep up caps the
    /// tokens a second it delivers and delays every first token behind its backlog
    /// (default 0: tokens reach the client when their step ends).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frontend_update_us: Option<f64>,
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
    /// Compute efficiency of fp8 GEMMs relative to `gemm_compute_eff` (their fraction of
    /// the fp8 tensor-core peak over the 16-bit GEMMs' fraction of theirs). The default is
    /// `sim calibrate --observed`'s fit to aiconfigurator's fp8 deployments
    /// (`calibration/fp8-gemm.toml`, held-out errors in VALIDATION.md).
    pub fp8_compute_eff: f64,
    /// Compute efficiency of fp4 (NVFP4, MXFP4) GEMMs on fp4 tensor cores relative to
    /// `gemm_compute_eff` (their fraction of the fp4 peak over the 16-bit GEMMs' fraction
    /// of theirs). The default is `sim calibrate --observed`'s fit to aiconfigurator's
    /// NVFP4 deployments on Blackwell (`calibration/fp4-gemm.toml`).
    pub fp4_compute_eff: f64,
    /// Weight-streaming efficiency of fp8 GEMMs relative to `gemm_memory_eff`: at a decode
    /// step's few rows an fp8 kernel (per-tensor or per-block scales, activations quantized
    /// on the fly, tiles sized for the fp8 tensor cores) reads its weights further from the
    /// bandwidth roof than a 16-bit one. The default is `sim calibrate --observed`'s fit to
    /// aiconfigurator's fp8 deployments of dense models (`calibration/fp8-memory.toml`).
    pub fp8_memory_eff: f64,
    /// The same for fp4 (NVFP4, MXFP4) GEMMs on fp4 tensor cores (4-bit values with an
    /// 8-bit scale per 16: 0.5625 bytes a weight, unpacked in the kernel). The default is
    /// `sim calibrate --observed`'s fit to aiconfigurator's NVFP4 deployments of dense
    /// models on Blackwell (`calibration/fp4-memory.toml`).
    pub fp4_memory_eff: f64,
    /// Efficiency of a mixture of experts' grouped GEMMs relative to dense ones (compute and
    /// memory alike). The default is `sim calibrate --observed`'s fit to aiconfigurator's
    /// mixture-of-experts deployments (`calibration/moe-gemm.toml`).
    pub moe_gemm_eff: f64,
    /// Efficiency of the grouped GEMMs' compute side alone, relative to dense GEMMs'
    /// (`None`: `moe_gemm_eff`, one efficiency on both sides). A prefill's grouped GEMMs
    /// are compute-bound and a decode's stream the experts' weights, and a kernel can be
    /// slow at the first only: one that dequantises the experts' weights tile by tile (a
    /// format the GPU's tensor cores do not take: MXFP4 experts on a Hopper), or one whose
    /// large prefills schedule tiles over many experts worse than a dense GEMM's;
    /// `moe_gemm_eff` stays the streaming side's. Fitted per engine, GPU, expert format and
    /// experts' shape (`[cost.by_gpu.<gpu>.experts.<format>]`, `.shapes.<shape>`), since
    /// each format runs its own kernels and each shape its own tiles.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moe_compute_eff: Option<f64>,
    /// Fixed cost per expert of the model, per MoE layer of a step that prefills (a chunk
    /// of more than one token), microseconds: a prefill's grouped GEMMs run every expert
    /// as its own problem (tile scheduling, per-expert scales and launches, outside the
    /// CUDA graphs decode steps replay), whatever its tokens; under expert parallelism a
    /// rank holds fewer experts but waits for the others' at each dispatch and combine, and
    /// the measured floors do not shrink with EP. The default is `sim calibrate --observed`'s fit
    /// to aiconfigurator's mixture-of-experts deployments (`calibration/moe-prefill.toml`).
    pub moe_prefill_expert_us: f64,
    /// Fixed cost per MoE layer of every step, microseconds: the router's top-k, sorting
    /// tokens by expert, permuting them to their experts and back, small kernels whose
    /// time hardly depends on the batch (what makes a small-batch decode of a mixture of
    /// experts slower than its weight reads). The default is `sim calibrate --observed`'s
    /// fit to aiconfigurator's mixture-of-experts deployments (`calibration/moe-layer.toml`).
    pub moe_layer_us: f64,
    /// Skew of the routers' expert popularity, as the exponent of Zipf's law (0: uniform
    /// routing, every expert equally likely; 1: the i-th most popular expert takes 1/i of
    /// the traffic of the first). Skewed routing touches fewer distinct experts, so a
    /// decode step reads fewer expert weights (see [`super::Routing`]). The default is
    /// `sim calibrate --observed`'s fit to aiconfigurator's mixture-of-experts deployments
    /// (`calibration/moe-skew.toml`).
    pub moe_routing_skew: f64,
    /// A folder of measured operator times of this model on this GPU (LLMServingSim's
    /// profiler: the folder of `meta.yaml`, with `tp<N>/` per degree), relative to the
    /// scenario's folder: the layers' operators, LM head and sampler are priced from it
    /// instead of the efficiencies above (see [`super::profiled`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operator_profile: Option<String>,
    /// Efficiencies that hold on one GPU only, by catalog GPU name or alias
    /// (`[cost.by_gpu.b200] fp8_compute_eff = 0.5`): they replace the table's own on that
    /// GPU ([`CostParams::on_gpu`], matched by the deployment's GPU name: a GPU described
    /// in a file takes the entry of the catalog GPU it is named as, if any), and an entry's
    /// `experts` terms replace those for a deployment whose experts are in that format, and
    /// a format's `shapes` terms those for experts of that shape
    /// ([`CostParams::on_deployment`]).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub by_gpu: BTreeMap<String, GpuCost>,
}

/// `fp8_compute_eff`'s default: the value in `calibration/fp8-gemm.toml` (a test ties them).
const FP8_EFF: f64 = 0.6;

/// `fp4_compute_eff`'s default: the value in `calibration/fp4-gemm.toml` (a test ties them).
const FP4_EFF: f64 = 0.4;

/// `fp8_memory_eff`'s default: the value in `calibration/fp8-memory.toml` (a test ties them).
const FP8_MEMORY_EFF: f64 = 0.85;

/// `fp4_memory_eff`'s default: the value in `calibration/fp4-memory.toml` (a test ties them).
const FP4_MEMORY_EFF: f64 = 0.6;

/// `allreduce_peer_us`'s default: the value in `calibration/allreduce-peer.toml` (a test
/// ties them).
const ALLREDUCE_PEER_US: f64 = 2.0;

/// `moe_prefill_expert_us`'s default: the value in `calibration/moe-prefill.toml` (a test
/// ties them).
const MOE_PREFILL_US: f64 = 8.0;

/// `moe_layer_us`'s default: the value in `calibration/moe-layer.toml` (a test ties them).
const MOE_LAYER_US: f64 = 10.0;

/// `moe_routing_skew`'s default: the value in `calibration/moe-skew.toml` (a test ties them).
const MOE_SKEW: f64 = 0.75;

/// `moe_gemm_eff`'s default: the value in `calibration/moe-gemm.toml` (a test ties them).
const MOE_EFF: f64 = 0.8;

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
            eager_layer_us: None,
            graph_max_tokens: None,
            allreduce_eff: None,
            allreduce_latency_us: None,
            custom_allreduce: None,
            allreduce_peer_us: ALLREDUCE_PEER_US,
            overlap_exponent: Some(1.5),
            step_overhead_us: None,
            per_seq_overhead_us: None,
            request_overhead_ms: None,
            frontend_request_ms: None,
            frontend_update_us: None,
            dequant_compute_eff: 0.85,
            w8_memory_eff: 0.74,
            w4_memory_eff: 0.56,
            fp8_compute_eff: FP8_EFF,
            fp4_compute_eff: FP4_EFF,
            fp8_memory_eff: FP8_MEMORY_EFF,
            fp4_memory_eff: FP4_MEMORY_EFF,
            moe_gemm_eff: MOE_EFF,
            moe_compute_eff: None,
            moe_prefill_expert_us: MOE_PREFILL_US,
            moe_layer_us: MOE_LAYER_US,
            moe_routing_skew: MOE_SKEW,
            operator_profile: None,
            by_gpu: BTreeMap::new(),
        }
    }
}

/// Rejects an expert kernels' entry (`path`, its place in the file) whose efficiencies lie
/// outside (0, 1] (its prefill floor is checked with the other microseconds).
fn check_experts(path: &str, e: &ExpertCost) -> Result<(), String> {
    for (k, v) in [
        ("moe_gemm_eff", e.moe_gemm_eff),
        ("moe_compute_eff", e.moe_compute_eff),
    ] {
        match v {
            Some(v) if !(v > 0.0 && v <= 1.0) => {
                return Err(format!("{path}.{k}: must be in (0, 1], got {v}"))
            }
            _ => {}
        }
    }
    Ok(())
}

impl CostParams {
    /// `by_gpu`'s entry for the catalog GPU `gpu` (its canonical name), if any.
    fn gpu_entry(&self, gpu: &str) -> Option<&GpuCost> {
        self.by_gpu
            .iter()
            .find(|(k, _)| crate::catalog::find_gpu(k).is_some_and(|g| g.name == gpu))
            .map(|(_, o)| o)
    }

    /// The parameters of a deployment on the catalog GPU `gpu` (its canonical name) whose
    /// experts (if any) are in `dtype` and of `shape`: [`CostParams::on_gpu`], with the
    /// entry's `experts` terms for that format over it, and that format's terms for the
    /// shape over those.
    pub fn on_deployment(&self, gpu: &str, dtype: Dtype, shape: Option<ExpertShape>) -> CostParams {
        let mut p = self.on_gpu(gpu);
        if let Some(e) = self
            .gpu_entry(gpu)
            .and_then(|o| o.experts.get(ExpertFormat::of(dtype).name()))
        {
            e.apply_shaped(&mut p, shape);
        }
        p
    }

    /// The parameters on the catalog GPU `gpu` (its canonical name): `by_gpu`'s entry for
    /// it, if any, over the table's own efficiencies (not its `experts` terms, which
    /// [`CostParams::on_deployment`] adds for the deployment's expert format).
    pub fn on_gpu(&self, gpu: &str) -> CostParams {
        let mut p = self.clone();
        if let Some(o) = self.gpu_entry(gpu) {
            if let Some(e) = o.gemm_compute_eff {
                p.gemm_compute_eff = e;
            }
            if let Some(e) = o.fp8_compute_eff {
                p.fp8_compute_eff = e;
            }
            if let Some(e) = o.fp4_compute_eff {
                p.fp4_compute_eff = e;
            }
            if let Some(e) = o.fp8_memory_eff {
                p.fp8_memory_eff = e;
            }
            if let Some(e) = o.fp4_memory_eff {
                p.fp4_memory_eff = e;
            }
            if o.allreduce_eff.is_some() {
                p.allreduce_eff = o.allreduce_eff;
            }
            if o.eager_layer_us.is_some() {
                p.eager_layer_us = o.eager_layer_us;
            }
            ExpertCost {
                moe_gemm_eff: o.moe_gemm_eff,
                moe_compute_eff: o.moe_compute_eff,
                moe_prefill_expert_us: o.moe_prefill_expert_us,
                shapes: BTreeMap::new(),
            }
            .apply(&mut p);
        }
        p
    }

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

    /// The front end's delay per request in effect, nanoseconds.
    pub fn request_overhead_ns(&self) -> u64 {
        (self.request_overhead_ms.unwrap_or(0.0) * 1e6).round() as u64
    }

    /// The front end's serial times in effect, nanoseconds: per request and per streamed
    /// update.
    pub fn frontend_serial_ns(&self) -> (u64, u64) {
        (
            (self.frontend_request_ms.unwrap_or(0.0) * 1e6).round() as u64,
            (self.frontend_update_us.unwrap_or(0.0) * 1e3).round() as u64,
        )
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
            ("cost.fp8_compute_eff", self.fp8_compute_eff),
            ("cost.fp4_compute_eff", self.fp4_compute_eff),
            ("cost.fp8_memory_eff", self.fp8_memory_eff),
            ("cost.fp4_memory_eff", self.fp4_memory_eff),
            ("cost.moe_gemm_eff", self.moe_gemm_eff),
            ("cost.moe_compute_eff", self.moe_compute_eff.unwrap_or(1.0)),
        ];
        for (k, v) in effs {
            if !(v > 0.0 && v <= 1.0) {
                return Err(format!("{k}: must be in (0, 1], got {v}"));
            }
        }
        let mut seen: Vec<&str> = Vec::new();
        for (name, o) in &self.by_gpu {
            let Some(gpu) = crate::catalog::find_gpu(name) else {
                let names: Vec<&str> = crate::catalog::gpus().map(|g| g.name).collect();
                return Err(format!(
                    "cost.by_gpu.{name}: {}",
                    crate::messages::unknown_name("GPU", name, &names, "sim gpus")
                ));
            };
            if seen.contains(&gpu.name) {
                return Err(format!(
                    "cost.by_gpu.{name}: {} is given twice (by another of its names)",
                    gpu.name
                ));
            }
            seen.push(gpu.name);
            for (k, v) in o.keys() {
                if !(v > 0.0 && v <= 1.0) {
                    return Err(format!(
                        "cost.by_gpu.{name}.{k}: must be in (0, 1], got {v}"
                    ));
                }
            }
            for (f, e) in &o.experts {
                if ExpertFormat::from_name(f).is_none() {
                    let known: Vec<String> = ExpertFormat::ALL
                        .iter()
                        .map(|f| format!("`{}`", f.name()))
                        .collect();
                    return Err(format!(
                        "cost.by_gpu.{name}.experts.{f}: unknown expert format `{f}`, expected one of {}",
                        known.join(", ")
                    ));
                }
                check_experts(&format!("cost.by_gpu.{name}.experts.{f}"), e)?;
                for (shape, e) in &e.shapes {
                    let path = format!("cost.by_gpu.{name}.experts.{f}.shapes.{shape}");
                    if ExpertShape::from_name(shape).is_none() {
                        return Err(format!(
                            "{path}: unknown expert shape `{shape}`, expected <hidden>x<intermediate> (e.g. `7168x2048`)"
                        ));
                    }
                    if !e.shapes.is_empty() {
                        return Err(format!(
                            "{path}.shapes: a shape's terms take no shapes of their own"
                        ));
                    }
                    check_experts(&path, e)?;
                }
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
            ("cost.allreduce_peer_us", self.allreduce_peer_us),
            ("cost.step_overhead_us", self.step_overhead_us()),
            ("cost.per_seq_overhead_us", self.per_seq_overhead_us()),
            ("cost.moe_prefill_expert_us", self.moe_prefill_expert_us),
            ("cost.moe_layer_us", self.moe_layer_us),
        ]
        .map(|(k, v)| (k.to_string(), v));
        // A GPU's own prefill floor is microseconds like the shared one, not an efficiency.
        let gpu_floors = self.by_gpu.iter().flat_map(|(name, o)| {
            let own = o
                .moe_prefill_expert_us
                .map(|us| (format!("cost.by_gpu.{name}.moe_prefill_expert_us"), us));
            let formats = o.experts.iter().flat_map(move |(f, e)| {
                let path = format!("cost.by_gpu.{name}.experts.{f}");
                let shapes = e.shapes.iter().filter_map(move |(s, e)| {
                    e.moe_prefill_expert_us
                        .map(|us| (format!("{path}.shapes.{s}.moe_prefill_expert_us"), us))
                });
                e.moe_prefill_expert_us
                    .map(|us| {
                        (
                            format!("cost.by_gpu.{name}.experts.{f}.moe_prefill_expert_us"),
                            us,
                        )
                    })
                    .into_iter()
                    .chain(shapes)
            });
            own.into_iter().chain(formats)
        });
        if !(0.0..=4.0).contains(&self.moe_routing_skew) {
            return Err(format!(
                "cost.moe_routing_skew: must be a Zipf exponent from 0 (uniform routing) to 4, got {}",
                self.moe_routing_skew
            ));
        }
        let eager = std::iter::once(("cost.eager_layer_us".to_string(), self.eager_layer_us))
            .chain(self.by_gpu.iter().map(|(name, o)| {
                (
                    format!("cost.by_gpu.{name}.eager_layer_us"),
                    o.eager_layer_us,
                )
            }));
        for (k, us) in eager {
            if let Some(us) = us {
                if !(0.0..=100_000.0).contains(&us) {
                    return Err(format!("{k}: must be 0 to 100000 us, got {us}"));
                }
            }
        }
        match (self.graph_max_tokens, self.eager_layer_us) {
            (Some(0), _) => {
                return Err(
                    "cost.graph_max_tokens: must be at least 1 (a CUDA graph replays one token or more), got 0"
                        .into(),
                )
            }
            // It only says which decodes get the floor: alone it would change nothing.
            (Some(_), None) => {
                return Err(
                    "cost.graph_max_tokens: needs cost.eager_layer_us, the host's floor it applies to the decodes beyond the graphs"
                        .into(),
                )
            }
            _ => {}
        }
        if let Some(ms) = self.request_overhead_ms {
            if !(0.0..=60_000.0).contains(&ms) {
                return Err(format!(
                    "cost.request_overhead_ms: must be 0 to 60000 ms, got {ms}"
                ));
            }
        }
        if let Some(ms) = self.frontend_request_ms {
            if !(0.0..=60_000.0).contains(&ms) {
                return Err(format!(
                    "cost.frontend_request_ms: must be 0 to 60000 ms, got {ms}"
                ));
            }
        }
        if let Some(us) = self.frontend_update_us {
            if !(0.0..=1_000_000.0).contains(&us) {
                return Err(format!(
                    "cost.frontend_update_us: must be 0 to 1000000 us, got {us}"
                ));
            }
        }
        for (k, v) in overheads.into_iter().chain(gpu_floors) {
            if !(v >= 0.0 && v.is_finite()) {
                return Err(format!("{k}: must be a non-negative number, got {v}"));
            }
        }
        Ok(())
    }
}
