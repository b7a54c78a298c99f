//! The cost model against aiconfigurator's measured deployments
//! (`calibration/serving/aiconfigurator/silicon.csv`): every aggregated row of a dense model
//! and a GPU the catalog has is simulated as the benchmark ran it — `concurrency` clients
//! in a closed loop (one replica's share, `batch_size`, where the deployment had several),
//! `10 x concurrency` requests, all clients starting at once, on `tp` GPUs, in the row's
//! dtype, under the engine's own serving defaults — and its mean TTFT and TPOT set against
//! the measured ones. The request stream is the client's:
//! [`BenchClient::InferenceX`] rows (a fork of vLLM's `benchmark_serving`,
//! `--random-range-ratio 0.8`) draw prompt and output lengths uniform in `[0.8 L, L]`;
//! [`BenchClient::Aiperf`] rows (aiconfigurator's gap analysis) send exactly `isl`/`osl`,
//! vLLM's, TensorRT-LLM's and (from 0.5.6, with mixed chunks) SGLang's under the settings
//! aiconfigurator's generator gives those deployments (`aiperf_settings`), each client's
//! next request reaching the engine a fitted spread of milliseconds after its last ended
//! ([`aiperf_turnaround_ms`]): how the identical requests bunch into steps, and so how long
//! each prompt queues, follows from it. Rows not simulated are counted by reason (a model
//! or GPU not in the catalog, pipeline parallelism, a repeated measurement, clients not
//! recorded, a deployment that does not fit).
//!
//! In: the CSV. Out: one [`SiliconCheck`] per simulated row, and the skipped counts.

use std::path::Path;

use rayon::prelude::*;

use crate::catalog::Dtype;
use crate::observed::silicon::{AggregateRow, BenchClient, Parallelism};
use crate::run::{run_variant, BackendKind};
use crate::scenario::Scenario;
use crate::workload::{ArrivalConfig, LengthDist};

/// Cost terms an engine's rows are simulated with, over the scenario's (`None`: keep).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineCost {
    /// `cost.request_overhead_ms`.
    pub request_overhead_ms: Option<f64>,
    /// `cost.step_overhead_us`.
    pub step_overhead_us: Option<f64>,
    /// `cost.allreduce_latency_us`.
    pub allreduce_latency_us: Option<f64>,
    /// `cost.eager_layer_us`.
    pub eager_layer_us: Option<f64>,
    /// `cost.fp8_compute_eff`.
    pub fp8_compute_eff: Option<f64>,
    /// `cost.allreduce_eff`.
    pub allreduce_eff: Option<f64>,
    /// `cost.allreduce_peer_us`.
    pub allreduce_peer_us: Option<f64>,
    /// `cost.fp4_compute_eff`.
    pub fp4_compute_eff: Option<f64>,
    /// `cost.fp8_memory_eff`.
    pub fp8_memory_eff: Option<f64>,
    /// `cost.fp4_memory_eff`.
    pub fp4_memory_eff: Option<f64>,
    /// `cost.moe_gemm_eff`.
    pub moe_gemm_eff: Option<f64>,
    /// `cost.moe_prefill_expert_us`.
    pub moe_prefill_expert_us: Option<f64>,
    /// `cost.moe_compute_eff`.
    pub moe_compute_eff: Option<f64>,
    /// `cost.moe_layer_us`.
    pub moe_layer_us: Option<f64>,
    /// `cost.moe_routing_skew`.
    pub moe_routing_skew: Option<f64>,
    /// The conditional acceptance rate of each multi-token-prediction draft in the rows
    /// measured with speculative decoding (`None`: [`MTP_ACCEPTANCE`]; 0: simulated
    /// without speculative decoding, as before the rows' settings were known).
    pub mtp_acceptance: Option<f64>,
    /// The spread of the aiperf clients' turnaround, milliseconds (`None`: the engine's,
    /// [`aiperf_turnaround_ms`]).
    pub aiperf_turnaround_ms: Option<f64>,
    /// A setting of the benchmark the rows do not record (default: as they record it).
    pub unrecorded: Unrecorded,
    /// `cost.frontend_update_us`: the serial front end's time per streamed update.
    pub frontend_update_us: Option<f64>,
}

/// A setting of a measured run that its row does not record, which `sim calibrate
/// --observed` chooses per campaign (the rows of one engine version, model and GPU, which
/// one harness measured in one sweep) by the campaign's held-out error
/// ([`crate::cost_model::calibration::observed`]). Each is something the rows' harnesses
/// and engines are known to do in some configurations and that a row cannot show.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Unrecorded {
    /// As the row and its generator's settings say.
    #[default]
    AsRecorded,
    /// The engine runs one sequence fewer than the clients (at least one): a finished
    /// request holds its slot until another ends, or the engine was given one slot less.
    /// A closed loop then always has one request waiting for the next to finish, which
    /// adds about `1/clients` of a request's duration to every TTFT.
    HeldSlot,
    /// The client's prompts repeat and the engine caches them: each request sends one of
    /// [`PROMPT_POOL`] prompts drawn at random with replacement (aiperf's synthetic dataset
    /// up to 0.2, `--num-dataset-entries` 100), with the prefix cache on (vLLM's and
    /// SGLang's default), so a repeated prompt prefills only its last block.
    PromptPool,
    /// A step holds about one prompt: the token budget (`max_num_batched_tokens`, or
    /// SGLang's `max_prefill_tokens` for its mixed steps) is the longest sequence the
    /// scenario checks allow (prompt and output) plus one token per client and 64, rounded
    /// up to 32, where the generator's rule gives clients + prompt + 1,500 (which holds two
    /// 1,024-token prompts). Versions of the generator before its rules set the budget did
    /// not record what they gave (see [`aiperf_settings`]).
    OnePrompt,
}

impl Unrecorded {
    /// Every setting, the recorded one first.
    pub const ALL: [Unrecorded; 4] = [
        Unrecorded::AsRecorded,
        Unrecorded::HeldSlot,
        Unrecorded::PromptPool,
        Unrecorded::OnePrompt,
    ];

    /// The setting's name in calibration files (`held-slot`).
    pub fn name(self) -> &'static str {
        match self {
            Unrecorded::AsRecorded => "as-recorded",
            Unrecorded::HeldSlot => "held-slot",
            Unrecorded::PromptPool => "prompt-pool",
            Unrecorded::OnePrompt => "one-prompt",
        }
    }
}

/// Distinct prompts of aiperf's synthetic dataset (`--num-dataset-entries`' default).
pub const PROMPT_POOL: u32 = 100;

/// `(why, rows)` of the rows not simulated.
pub type Skipped = Vec<(String, usize)>;

/// One simulated row.
#[derive(Debug, Clone)]
pub struct SiliconCheck {
    /// The measured row.
    pub row: AggregateRow,
    /// Catalog model and GPU it ran on.
    pub model: &'static str,
    /// Catalog GPU.
    pub gpu: &'static str,
    /// Simulated mean TTFT (ms).
    pub ttft_ms: f64,
    /// Simulated mean TPOT (ms).
    pub tpot_ms: f64,
}

impl SiliconCheck {
    /// Signed relative TTFT error.
    pub fn ttft_error(&self) -> f64 {
        self.ttft_ms / self.row.ttft_ms - 1.0
    }
    /// Signed relative TPOT error.
    pub fn tpot_error(&self) -> f64 {
        self.tpot_ms / self.row.tpot_ms - 1.0
    }
}

/// Requests each closed loop runs, in multiples of its concurrency (InferenceX's
/// `--num-prompts $((CONC*10))`).
pub const WAVES: u64 = 10;

/// The conditional acceptance rate of each draft of the InferenceX rows measured with
/// multi-token prediction (`speculative.acceptance = [MTP_ACCEPTANCE]`: draft i is accepted
/// with probability `MTP_ACCEPTANCE^i`): none of them records it, and their prompts are random
/// tokens, so it is fitted to their TPOT (`calibration/mtp-acceptance.toml`, which a test
/// ties to this value).
pub const MTP_ACCEPTANCE: f64 = 0.6;

/// The spread of the turnaround of aiconfigurator's aiperf clients with `backend`'s server,
/// milliseconds: each client's next request reaches the engine a uniform draw in
/// `[0, this)` past the step that ended its last (`workload.arrival.think_jitter_s`).
/// aiperf hands a freed slot to a worker process, the worker sends the request, and the
/// engine's HTTP server tokenizes it before the scheduler sees it: milliseconds that differ
/// from request to request and that neither the rows nor aiperf record. That spread
/// decides how the clients' requests bunch into steps, which is most of a closed loop's
/// TTFT. The draw is taken before the request is sent, so TTFT does not count it (a fixed
/// front-end cost inside TTFT is `cost.request_overhead_ms`). Fitted per engine to the aiperf rows
/// ([`crate::cost_model::calibration::turnaround`], `calibration/aiperf-turnaround.toml`,
/// which a test ties to these values).
pub fn aiperf_turnaround_ms(backend: &str) -> f64 {
    match backend {
        "sglang" => 40.0,
        "trtllm" => 30.0,
        "vllm" => 10.0,
        // An engine not fitted: its clients' requests reach it as their last ends.
        _ => 0.0,
    }
}

/// InferenceX's client (`--random-range-ratio 0.8`) draws each length uniform in
/// `[RANGE_RATIO x L, L]` for the row's `L`.
pub(crate) const INFERENCEX_RANGE_RATIO: f64 = 0.8;

/// The mean of a length drawn as `client` draws it, as a fraction of the row's: InferenceX's
/// uniform range, aiperf's exact lengths.
pub(crate) fn mean_length_fraction(client: BenchClient) -> f64 {
    match client {
        BenchClient::InferenceX => (1.0 + INFERENCEX_RANGE_RATIO) / 2.0,
        BenchClient::Aiperf => 1.0,
    }
}

const TEMPLATE: &str = r#"
name = "silicon"
seed = 0

[model]
name = "llama-3.1-8b"

[hardware]
gpu = "h100-sxm"

[engine]
scheduler = "chunked"

[workload]
num_requests = 3
arrival = { process = "closed-loop", concurrency = 1 }

[[workload.class]]
name = "fixed"
prompt = { dist = "fixed", value = 1024 }
output = { dist = "fixed", value = 128 }
"#;

/// What a row resolves to: the catalog model and GPU, the weight format and the layout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Planned {
    /// Catalog model.
    pub model: &'static str,
    /// Catalog GPU.
    pub gpu: &'static str,
    /// Weight format.
    pub dtype: Dtype,
    /// Attention tensor parallelism.
    pub tp: u32,
    /// Attention data-parallel ranks.
    pub dp: u32,
    /// Expert parallelism.
    pub ep: u32,
    /// Clients in the closed loop (the row's, every replica's together).
    pub clients: u32,
}

/// Why a row whose clients were not recorded is not simulated (no `silicon_concurrency` and
/// no `_c<N>_` in its id: aiconfigurator's gap-analysis deployments of January 2026, whose
/// `batch_size` is their engines' batch size, and disaggregated rows).
pub(crate) const NO_CLIENTS: &str =
    "clients not recorded (no `silicon_concurrency`, no `_c<N>_` in the id)";

/// Why a row that repeats an earlier row's measurement is not simulated again.
pub(crate) const REPEATED: &str =
    "the same measurement as an earlier row (InferenceX's dumps overlap; counted once)";

/// Why an InferenceX GB200 row labelled `agg` is not simulated.
pub(crate) const MULTINODE: &str = "an InferenceX GB200 run labelled agg: a multi-node disaggregated deployment, tp_size its GPU count (pools not recorded)";

/// The GPUs of one GB200 compute tray: an aggregated engine of InferenceX's runs spans no
/// more.
const GB200_TRAY_GPUS: u32 = 4;

/// Whether a row is one of InferenceX's GB200 runs recorded as aggregated with more GPUs
/// than a tray holds. InferenceX ran GB200 only through Dynamo's multi-node disaggregated
/// launcher then (`runners/launch_gb200-nv.sh`, "launches multi-node benchmarks", for
/// Dynamo with TensorRT-LLM and with SGLang); its 2026-04-06 dump labels 44 DeepSeek-R1
/// runs of 2025-11 (27 TensorRT-LLM, 17 SGLang) `agg` with the deployment's GPU count, 20
/// to 72, as `tp_size`, and does not record the pools.
pub(crate) fn is_mislabelled_multinode(row: &AggregateRow) -> bool {
    row.mode == "agg"
        && row.client == BenchClient::InferenceX
        && row.system.starts_with("gb200")
        && row.tp.unwrap_or(1) > GB200_TRAY_GPUS
}

/// What a row resolves to, or why it is not simulated.
fn plan(row: &AggregateRow) -> Result<Planned, String> {
    if row.mode != "agg" {
        return Err("disaggregated (`sim validate-model` replays them as fleets)".into());
    }
    if row.repeats.is_some() {
        return Err(REPEATED.into());
    }
    let clients = row.concurrency.ok_or(NO_CLIENTS)?;
    if is_mislabelled_multinode(row) {
        return Err(MULTINODE.into());
    }
    if row.pp.unwrap_or(1) > 1 {
        return Err("pipeline parallelism".into());
    }
    let (model, gpu, dtype) = catalog_of(row)?;
    let moe = crate::catalog::find_model(model).is_some_and(|m| m.is_moe());
    let (tp, dp, ep) = layout(&row.parallel(), moe)?;
    Ok(Planned {
        model,
        gpu,
        dtype,
        tp,
        dp,
        ep,
        clients,
    })
}

/// A row's catalog model, catalog GPU and weight format, or why it has none.
pub(crate) fn catalog_of(
    row: &AggregateRow,
) -> Result<(&'static str, &'static str, Dtype), String> {
    let spec = crate::catalog::find_model_by_id(&row.model)
        .ok_or_else(|| format!("model `{}` not in the catalog", row.model))?;
    let dtype = match row.gemm_quant.as_str() {
        "" => Dtype::Bf16,
        "fp8" => Dtype::Fp8,
        "fp8_block" => Dtype::Fp8Block,
        // gpt-oss ships its experts in MXFP4, which the rows label fp4.
        "nvfp4" if spec.name.starts_with("gpt-oss") => Dtype::Mxfp4,
        "nvfp4" => Dtype::Nvfp4,
        q => return Err(format!("quantization `{q}`")),
    };
    let gpu = crate::catalog::find_gpu(&row.system)
        .map(|g| g.name)
        .ok_or_else(|| format!("GPU `{}` not in the catalog", row.system))?;
    Ok((spec.name, gpu, dtype))
}

/// A row's (attention TP, attention DP, EP). The stage's GPUs are `tp x attention_dp` for
/// attention and `moe_tp x moe_ep` for the experts. Two recording quirks are read as the
/// rows' ids say: rows whose `tp_size` (or `attention_dp_size`) is the square of
/// `moe_tp_size = moe_ep_size = n` ran on n GPUs (ids `..._tp8_ep8_...`: 8 GPUs, attention
/// TP 8, experts EP 8); vLLM rows whose experts span more GPUs than `tp_size` ran data
/// parallel (`--data-parallel-size`, attention DP).
pub(crate) fn layout(row: &Parallelism, moe: bool) -> Result<(u32, u32, u32), String> {
    let tp = row.tp.unwrap_or(1).max(1);
    let adp = row.attention_dp.unwrap_or(1).max(1);
    if !moe {
        return if adp > 1 {
            Err("attention data parallelism of a dense model".into())
        } else {
            Ok((tp, 1, 1))
        };
    }
    let ep = row.moe_ep.unwrap_or(1).max(1);
    let Some(moe_tp) = row.moe_tp.filter(|&m| m > 0) else {
        return Ok((tp, adp, ep));
    };
    let odd = || "attention and expert layouts over different GPU counts".to_string();
    let square = ep.checked_mul(ep).ok_or_else(odd)?;
    if moe_tp == ep && ep > 1 {
        if tp == square && adp == 1 {
            return Ok((ep, 1, ep));
        }
        if adp == square && tp == 1 {
            return Ok((1, ep, ep));
        }
    }
    let gpus = tp.checked_mul(adp).ok_or_else(odd)?;
    let experts = moe_tp.checked_mul(ep).ok_or_else(odd)?;
    if gpus == experts {
        Ok((tp, adp, ep))
    } else if adp == 1 && experts % tp == 0 {
        Ok((tp, experts / tp, ep))
    } else {
        Err(odd())
    }
}

/// Each engine's serving defaults that shape a closed loop, as their sources set them
/// for these GPUs (80-192 GB):
/// - vLLM V1: chunked prefill mixed into decode steps, an 8,192-token budget (its
///   default for the API server on large GPUs), 1,024 sequences, optimistic admission,
///   `gpu_memory_utilization` 0.9.
/// - SGLang 0.5: a prefill batch runs alone, decodes waiting (`enable_mixed_chunk` off), and
///   runs whenever a waiting request is admitted (prefill first), up to 8,192 tokens
///   (`chunked_prefill_size`); admission by its new-token-ratio estimate. Its memory
///   fraction depends on the version and the launch: [`sglang_mem_fraction_static`], set
///   where the row's settings are known (a disaggregated row's pools: its recipe's, else 0.82).
/// - TensorRT-LLM (PyTorch backend): context and generation requests in one step up to
///   `max_num_tokens` 8,192; `GUARANTEED_NO_EVICT` reserves prompt + output at admission;
///   the KV cache takes 0.9 of the memory weights and activations leave (set in
///   [`simulate`] once the plan knows them).
pub(crate) fn engine_defaults(engine: &mut crate::scenario::EngineConfig, backend: &str) {
    use engine::scheduler::{AdmissionPolicy, SchedulerKind};
    engine.max_num_batched_tokens = Some(8192);
    engine.max_num_seqs = 1024;
    match backend {
        "sglang" => {
            engine.scheduler = SchedulerKind::Continuous;
            engine.admission = AdmissionPolicy::Estimated;
        }
        "trtllm" => {
            engine.scheduler = SchedulerKind::Chunked;
            engine.admission = AdmissionPolicy::WorstCase;
        }
        _ => {
            engine.scheduler = SchedulerKind::Chunked;
        }
    }
}

/// What an SGLang launch sets that its memory fraction depends on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SglangLaunch {
    /// `--tp-size` (with attention data parallelism, every rank's GPUs: attention TP x DP).
    pub tp: u32,
    /// `--dp-size` under `--enable-dp-attention`; 1 without it.
    pub dp_attention: u32,
    /// The largest `--cuda-graph-bs` the launch lists; `None`: SGLang's default for the GPU.
    pub cuda_graph_max_bs: Option<u32>,
    /// An EAGLE-style draft (multi-token prediction) runs beside the model.
    pub speculative: bool,
}

impl SglangLaunch {
    /// `tp` GPUs, nothing else set.
    #[cfg(test)]
    pub(crate) fn plain(tp: u32) -> Self {
        Self {
            tp,
            dp_attention: 1,
            cuda_graph_max_bs: None,
            speculative: false,
        }
    }
}

/// SGLang's `--mem-fraction-static` where a launch sets none (`ServerArgs`' memory
/// heuristics), for `version` on a GPU of `gpu_bytes` (SGLang reads the total nvidia-smi
/// reports, in MiB, as the catalog records it). The fraction holds weights and KV cache;
/// the rest is left for activations, CUDA graphs and the runtime.
/// - Up to 0.5.2 a reserve per GPU class: 2.8 GiB + TP/10 below 35 GiB, 9.5 GiB + TP/2
///   below 90 GiB (H100), 12 GiB + TP/2 below 160 GiB (H200), 32 GiB above (B200, GB200);
///   2 GiB more with a draft model, 4 GiB more under attention data parallelism.
/// - From 0.5.3 (sgl-project/sglang #10975 and #11076, merged at the end of September
///   2025), and for rows that name no version (InferenceX's of 2026): 512 MiB, 1.5 MiB per
///   token of the chunked-prefill size (2,048 below 35 GiB, 4,096 below 60 GiB, 8,192 below
///   160 GiB, 16,384 above), 2 MiB per CUDA-graph batch size (its default largest: 256
///   below TP4 and 512 from it from 60 GiB on; 512 above 160 GiB), 128 MiB per GPU of the
///   TP group, under attention data parallelism 3 MiB per graph batch and rank (4.5 above
///   300), at least 10 GiB on GPUs above 60 GiB, then 2 GiB more with a draft model.
///
/// The fraction is rounded to three decimals, as SGLang rounds it. The rows of
/// `silicon.csv` are SGLang 0.5.1 (the first rule) and 0.5.5 to 0.5.9 and nightly builds
/// (the second); 0.5.3 as the boundary is not exercised by them.
pub(crate) fn sglang_mem_fraction_static(
    version: &str,
    gpu_bytes: f64,
    launch: SglangLaunch,
) -> f64 {
    const GIB: f64 = 1024.0;
    let mem = gpu_bytes / f64::from(1u32 << 20);
    let tp = f64::from(launch.tp.max(1));
    let dp = launch.dp_attention.max(1);
    let reserved = if sglang_at_least(version, (0, 5, 3)).unwrap_or(true) {
        let (chunk, graphs) = if mem < 35.0 * GIB {
            (2048.0, if launch.tp < 4 { 24 } else { 80 })
        } else if mem < 60.0 * GIB {
            (4096.0, if launch.tp < 4 { 32 } else { 160 })
        } else if mem < 160.0 * GIB {
            (8192.0, if launch.tp < 4 { 256 } else { 512 })
        } else {
            (16384.0, 512)
        };
        let graphs = f64::from(launch.cuda_graph_max_bs.unwrap_or(graphs));
        let mut r = 512.0 + 1.5 * chunk + 2.0 * graphs + tp / 8.0 * GIB;
        if dp > 1 {
            r += graphs * f64::from(dp) * if graphs > 300.0 { 4.5 } else { 3.0 };
        }
        if mem > 60.0 * GIB {
            r = r.max(10.0 * GIB);
        }
        r + if launch.speculative { 2.0 * GIB } else { 0.0 }
    } else {
        let mut r = if mem < 35.0 * GIB {
            (2.8 + tp / 10.0) * GIB
        } else if mem < 90.0 * GIB {
            (9.5 + tp / 2.0) * GIB
        } else if mem < 160.0 * GIB {
            (12.0 + tp / 2.0) * GIB
        } else {
            32.0 * GIB
        };
        if launch.speculative {
            r += 2.0 * GIB;
        }
        if dp > 1 {
            r += 4.0 * GIB;
        }
        r
    };
    (((mem - reserved) / mem) * 1000.0).round() / 1000.0
}

/// The `gpu_memory_utilization` that gives `plan`'s deployment SGLang's KV cache at the
/// memory fraction the plan was made with: SGLang's fraction holds weights and KV cache
/// only (activations are in the rest), so the cache is `fraction x memory - weights -`
/// the runtime reserve (CUDA context and NCCL's buffers, which its free-memory probe after
/// loading sees as taken), where the plan would also take the activations.
pub(crate) fn sglang_memory_share(plan: &crate::cost_model::MemoryPlan) -> f64 {
    (plan.gpu_memory_utilization + plan.activation_bytes / plan.gpu_mem_bytes).min(1.0)
}

/// Whether an SGLang `version` is at least `min`; `None` for a version that names no
/// release (empty, or a nightly build: both current at the time of their rows).
fn sglang_at_least(version: &str, min: (u32, u32, u32)) -> Option<bool> {
    let mut parts = version
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    match (parts.next(), parts.next(), parts.next()) {
        (Some(Some(major)), Some(Some(minor)), patch) => {
            Some((major, minor, patch.flatten().unwrap_or(0)) >= min)
        }
        _ => None,
    }
}

/// What aiconfigurator's generator sets for the deployments its gap analysis measured with
/// aiperf (ai-dynamo/aiconfigurator, `generator/rule_plugin/benchmark/{vllm,trtllm}.rule` and
/// `generator/config/backend_templates/trtllm/extra_engine_args.1.0.0rc3.yaml.j2`, the
/// versions of most of the rows: TensorRT-LLM 1.0.0rc3, vLLM 0.12.0; the 1.3.0rc1 template
/// sets the same), and how its clients send:
/// - vLLM and TensorRT-LLM: the row's `batch_size` as the most sequences (`max_batch_size`,
///   `--max-num-seqs`) and `batch_size + isl + 1500` tokens a step (`max_num_tokens`,
///   `--max-num-batched-tokens`; TensorRT-LLM's rounded up to a multiple of 32, as the
///   generator's rules do since January 2026, which the 1.0 runs may not have: at most 31
///   tokens): a step holds about one prompt;
/// - TensorRT-LLM (every aiperf row, 1.0.0rc3 to 1.3.0rc5): `enable_chunked_prefill: false`
///   (a prompt joins a step whole) and
///   `free_gpu_memory_fraction` 0.80 ([`trtllm_free_fraction`]);
/// - SGLang from 0.5.6 on ([`sglang_mixes_chunks`]): the generator's rule
///   (`generator/rule_plugin/benchmark/sglang.rule`) sets `max_prefill_tokens = isl + 1500`,
///   `enable_mixed_chunk` and the row's `batch_size` as `max_running_requests`: each step's
///   decodes ride with a prefill (the chunked scheduler under `max_prefill_tokens`, 8,192
///   tokens a chunk). Its earlier rows (0.5.1.post1, H100) keep the prefill-first defaults:
///   the generator emitted the flag only from 19 January 2026 (aiconfigurator #257, #258),
///   and those rows match prefill-first waves at 8,192 tokens;
/// - aiperf (`--concurrency`, exact lengths): each client sends its next request when its
///   last ends, reaching the engine `turnaround_ms` x U[0, 1) later.
pub(crate) fn aiperf_settings(
    cfg: &mut crate::scenario::ScenarioConfig,
    row: &AggregateRow,
    clients: u32,
    turnaround_ms: f64,
) {
    if row.backend != "sglang" {
        let budget = clients + row.isl + 1500;
        cfg.engine.max_num_batched_tokens = Some(if row.backend == "trtllm" {
            budget.div_ceil(32) * 32
        } else {
            budget
        });
        cfg.engine.max_num_seqs = clients;
    } else if sglang_mixes_chunks(&row.backend_version) {
        cfg.engine.scheduler = engine::scheduler::SchedulerKind::Chunked;
        cfg.engine.max_prefill_tokens = Some(row.isl + 1500);
        cfg.engine.max_num_seqs = clients;
    }
    if row.backend == "trtllm" {
        cfg.engine.enable_chunked_prefill = false;
    }
    if let Some(ArrivalConfig::ClosedLoop { think_jitter_s, .. }) = cfg.workload.arrival.as_mut() {
        *think_jitter_s = turnaround_ms / 1000.0;
    }
}

/// Whether aiconfigurator's generator ran an SGLang `version` with mixed chunks: from
/// 0.5.6 on (its `cli_args.0.5.6.post2.j2` template came on 23 January 2026, after the flag
/// reached the generator on the 19th; the 0.5.6.post2 H100 rows are dated 23-25 January),
/// and the nightly builds (February to April 2026). Earlier versions and unknown ones: no.
pub(crate) fn sglang_mixes_chunks(version: &str) -> bool {
    version.starts_with("nightly") || sglang_at_least(version, (0, 5, 6)) == Some(true)
}

/// What InferenceX's scripts for its dense rows (Llama-3.1/3.3-70B, `benchmarks/70b_*.sh`
/// until the model left its sweep in October 2025) set beyond the engines' defaults:
/// - vLLM 0.10 (`vllm serve --config`): `kv-cache-dtype: fp8`, `max-num-batched-tokens:
///   8192`, prefix caching off (its random prompts share nothing anyway).
/// - TensorRT-LLM (`trtllm-serve`): an fp8 KV cache (`kv_cache_config.dtype`, already the
///   fp8 checkpoints' own), `--max_num_tokens 16384`, and for 1k/1k below TP8 batch waiting
///   (`batch_wait_timeout_iters: 20`, `batch_wait_max_tokens_ratio: 0.9`): a new prompt
///   waits up to 20 steps while others decode, which is most of those rows' TTFT.
pub(crate) fn inferencex_dense_settings(
    cfg: &mut crate::scenario::ScenarioConfig,
    row: &AggregateRow,
    tp: u32,
) {
    match row.backend.as_str() {
        "vllm" => {
            cfg.model.kv_dtype = Some(Dtype::Fp8);
            cfg.engine.enable_prefix_caching = false;
        }
        "trtllm" => {
            cfg.engine.max_num_batched_tokens = Some(16_384);
            if row.isl == 1024 && row.osl == 1024 && tp < 8 {
                cfg.engine.batch_wait_timeout_iters = 20;
                cfg.engine.batch_wait_max_tokens_ratio = 0.9;
            }
        }
        _ => {}
    }
}

/// What InferenceX's SGLang scripts for B200 (`benchmarks/single_node/dsr1_fp8_b200.sh`,
/// `dsr1_fp4_b200.sh`, `qwen3.5_bf16_b200.sh`, `qwen3.5_fp8_b200.sh`, unchanged in these
/// respects from September 2025 to April 2026) set beyond the engine's defaults:
/// `--scheduler-recv-interval` 30 at 16 clients or more and 10 below (10 for DeepSeek-R1
/// in fp8 at TP4): while sequences decode, new requests are taken in every 10 or 30 decode
/// steps, which at 16 clients adds about 15 decode steps to every TTFT. The H200 scripts
/// do not set it; the B200 scripts also set the prefill budget, memory fraction and an fp8
/// KV cache, and the H200 scripts their own (since stop 72; before, the engine's
/// defaults). Its TensorRT-LLM scripts with attention data parallelism turn on its
/// balancing (`attention_dp_config.enable_balance`), which holds new prompts back up to 60
/// steps (50 for gpt-oss) until every rank has one, and all set `max_num_tokens` (the KV
/// memory fraction is [`trtllm_free_fraction`]); its vLLM gpt-oss scripts turn prefix
/// caching off and, on B200, use an fp8 KV cache.
pub(crate) fn inferencex_moe_settings(
    cfg: &mut crate::scenario::ScenarioConfig,
    row: &AggregateRow,
    p: &Planned,
) {
    let gpt_oss = p.model.starts_with("gpt-oss");
    let clients = row.concurrency.unwrap_or(1);
    if row.backend == "vllm" && gpt_oss {
        // `kv-cache-dtype: fp8` on B200 only; prefix caching off everywhere.
        cfg.engine.enable_prefix_caching = false;
        if p.gpu == "b200" {
            cfg.model.kv_dtype = Some(Dtype::Fp8);
        }
        return;
    }
    if row.backend == "trtllm" {
        // `--max_num_tokens`: 20,000 for gpt-oss; for DeepSeek-R1 the clients plus a prompt
        // (rounded up to 64), at least 8,192.
        cfg.engine.max_num_batched_tokens = Some(if gpt_oss {
            20_000
        } else {
            (clients + row.isl + 64)
                .div_ceil(64)
                .saturating_mul(64)
                .max(8192)
        });
        // gpt-oss on H200: `kv_cache_config.dtype: auto` (its checkpoint's 16-bit cache).
        if gpt_oss && p.gpu == "h200" {
            cfg.model.kv_dtype = None;
        }
        if p.dp > 1 {
            // `attention_dp_config: {enable_balance: true, timeout_iters: 60}` for
            // DeepSeek-R1; `enable_balance: true` alone (the default timeout, 50) for gpt-oss.
            cfg.engine.adp_balance_timeout_iters = if gpt_oss { 50 } else { 60 };
        } else if p.gpu == "b200"
            && p.dtype == Dtype::Fp8
            && !gpt_oss
            && row.isl == 1024
            && row.osl == 1024
            && clients >= 64
        {
            // DeepSeek-R1 in fp8 on B200, 1k/1k from 64 clients: `batch_wait_timeout_iters:
            // 40`, `batch_wait_max_tokens_ratio: 0.8`.
            cfg.engine.batch_wait_timeout_iters = 40;
            cfg.engine.batch_wait_max_tokens_ratio = 0.8;
        }
        return;
    }
    if row.backend == "sglang" && p.gpu == "h200" && p.dp == 1 {
        // `dsr1_fp8_h200.sh` (January to April 2026): `--chunked-prefill-size` and
        // `--max-prefill-tokens` 32,768, `--mem-fraction-static 0.82`,
        // `--max-running-requests` 512 at 1k/1k and 256 otherwise, no radix cache;
        // `qwen3.5_fp8_h200.sh` (from March 2026): 16,384-token chunks,
        // `--mem-fraction-static 0.8`, 128 requests, `--kv-cache-dtype fp8_e4m3`, no radix
        // cache. Neither polls at an interval.
        cfg.engine.enable_prefix_caching = false;
        if p.model.starts_with("deepseek") {
            cfg.engine.max_num_batched_tokens = Some(32_768);
            cfg.engine.gpu_memory_utilization = 0.82;
            cfg.engine.max_num_seqs = if row.isl == 1024 && row.osl == 1024 {
                512
            } else {
                256
            };
        } else {
            cfg.engine.max_num_batched_tokens = Some(16_384);
            cfg.engine.gpu_memory_utilization = 0.8;
            cfg.engine.max_num_seqs = 128;
            if p.dtype != Dtype::Bf16 {
                cfg.model.kv_dtype = Some(Dtype::Fp8);
            }
        }
        return;
    }
    if row.backend != "sglang" || p.gpu != "b200" || p.dp > 1 {
        return;
    }
    let deepseek_fp8_tp4 = p.model.starts_with("deepseek") && p.dtype == Dtype::Fp8 && p.tp == 4;
    cfg.engine.recv_interval = if clients >= 16 && !deepseek_fp8_tp4 {
        30
    } else {
        10
    };
    // `--max-prefill-tokens` (a prefill batch's tokens), `--mem-fraction-static`, and
    // `--kv-cache-dtype fp8_e4m3` but for Qwen3.5 in bf16.
    let (prefill_tokens, mem_fraction) = match (p.model.starts_with("deepseek"), p.dtype) {
        (true, Dtype::Fp8) if p.tp == 4 => (8192, 0.95),
        (true, Dtype::Fp8) => (32_768, 0.82),
        (true, _) => (16_384, 0.85),
        (false, _) => (32_768, 0.82),
    };
    cfg.engine.max_num_batched_tokens = Some(prefill_tokens);
    cfg.engine.gpu_memory_utilization = mem_fraction;
    if p.dtype != Dtype::Bf16 {
        cfg.model.kv_dtype = Some(Dtype::Fp8);
    }
}

/// What InferenceX's scripts with multi-token prediction set (the row's `k` drafts a verify
/// step, from `inferencex-speculative.csv`), over [`inferencex_moe_settings`]:
/// - TensorRT-LLM (`dsr1_*_trt_mtp*.sh`): `speculative_config: {decoding_type: MTP,
///   num_nextn_predict_layers: k}` and `--max_num_tokens` of `(k + 1)` tokens for each of
///   `max_batch_size` sequences plus a prompt and 64, rounded up to 64 (the batch size is
///   the clients, a rank's share under attention data parallelism: the NVFP4 script of
///   2026-02-06 takes a quarter of the clients there, and the fp8 one of 2026-02-05 leaves
///   the KV cache 0.7 of the memory rather than 0.8, which three rows' budgets and the
///   latter's memory plan do not follow), with no 8,192 floor, and no batch waiting;
/// - SGLang (`dsr1_fp8_b200_mtp.sh`, `qwen3.5_fp8_b200_mtp.sh`): EAGLE over the model's MTP
///   layer (`--speculative-num-steps k`, top-k 1), DeepSeek-R1 with 16,384 prefill tokens,
///   Qwen3.5 with `--mem-fraction-static 0.8`.
///
/// Acceptance is not recorded: every draft is accepted with probability `acceptance`
/// given the ones before it.
fn mtp_settings(
    cfg: &mut crate::scenario::ScenarioConfig,
    row: &AggregateRow,
    p: &Planned,
    k: u32,
    acceptance: f64,
) {
    cfg.speculative = Some(crate::scenario::SpeculativeConfig::mtp(k, acceptance));
    let clients = row.concurrency.unwrap_or(1);
    match row.backend.as_str() {
        "trtllm" => {
            let batch = if p.dp > 1 {
                clients.div_ceil(p.dp)
            } else {
                clients
            };
            cfg.engine.max_num_batched_tokens =
                Some(((k + 1) * batch + row.isl + 64).div_ceil(64) * 64);
            // The scripts with MTP set no batch waiting.
            cfg.engine.batch_wait_timeout_iters = 0;
            cfg.engine.batch_wait_max_tokens_ratio = 0.0;
        }
        "sglang" if p.model.starts_with("deepseek") => {
            cfg.engine.max_num_batched_tokens = Some(16_384);
        }
        "sglang" => cfg.engine.gpu_memory_utilization = 0.8,
        _ => {}
    }
}

/// The CPU overheads an engine's rows run with: TensorRT-LLM's C++ runtime, or vLLM V1's
/// for vLLM and SGLang (both Python schedulers with CUDA graphs).
pub fn engine_framework(backend: &str) -> crate::cost_model::Framework {
    if backend == "trtllm" {
        crate::cost_model::Framework::TensorrtLlm
    } else {
        crate::cost_model::Framework::VllmV1
    }
}

/// The `[engine]` keys [`engine_defaults`] sets for `backend` beyond vLLM's, as TOML
/// (`scheduler = "continuous", admission = "estimated", max_num_batched_tokens = 8192`): what
/// a scenario that opts into the engine's fit should set too.
pub fn engine_keys(backend: &str) -> String {
    let mut e = crate::scenario::EngineConfig::default();
    engine_defaults(&mut e, backend);
    let name = |v: toml::Value| v.as_str().map(str::to_string).unwrap_or_default();
    let mut keys = vec![format!("scheduler = \"{}\"", e.scheduler.as_str())];
    if e.admission != engine::scheduler::AdmissionPolicy::default() {
        let admission = toml::Value::try_from(e.admission).map_or(String::new(), name);
        keys.push(format!("admission = \"{admission}\""));
    }
    if let Some(t) = e.max_num_batched_tokens {
        keys.push(format!("max_num_batched_tokens = {t}"));
    }
    keys.join(", ")
}

/// The configuration every run of `row` shares, one engine's or a fleet's: the model in
/// the row's format on its GPU, the engine's framework costs (with `engine`'s terms over
/// them), `clients` in a closed loop sending `WAVES x clients` requests of the client's
/// lengths. The engine's serving defaults and layout are left to the caller.
pub(crate) fn base_config(
    scn: &Scenario,
    row: &AggregateRow,
    (model, gpu, dtype): (&str, &str, Dtype),
    engine: EngineCost,
    clients: u32,
) -> crate::scenario::ScenarioConfig {
    let mut cfg = scn.base.clone();
    cfg.cost.framework = engine_framework(&row.backend);
    if engine.request_overhead_ms.is_some() {
        cfg.cost.request_overhead_ms = engine.request_overhead_ms;
    }
    if engine.step_overhead_us.is_some() {
        cfg.cost.step_overhead_us = engine.step_overhead_us;
    }
    if engine.frontend_update_us.is_some() {
        cfg.cost.frontend_update_us = engine.frontend_update_us;
    }
    if engine.allreduce_latency_us.is_some() {
        cfg.cost.allreduce_latency_us = engine.allreduce_latency_us;
    }
    if engine.eager_layer_us.is_some() {
        cfg.cost.eager_layer_us = engine.eager_layer_us;
    }
    if let Some(e) = engine.fp8_compute_eff {
        cfg.cost.fp8_compute_eff = e;
    }
    if engine.allreduce_eff.is_some() {
        cfg.cost.allreduce_eff = engine.allreduce_eff;
    }
    if let Some(us) = engine.allreduce_peer_us {
        cfg.cost.allreduce_peer_us = us;
    }
    if let Some(e) = engine.fp4_compute_eff {
        cfg.cost.fp4_compute_eff = e;
    }
    if let Some(e) = engine.fp8_memory_eff {
        cfg.cost.fp8_memory_eff = e;
    }
    if let Some(e) = engine.fp4_memory_eff {
        cfg.cost.fp4_memory_eff = e;
    }
    if let Some(e) = engine.moe_gemm_eff {
        cfg.cost.moe_gemm_eff = e;
    }
    if let Some(us) = engine.moe_prefill_expert_us {
        cfg.cost.moe_prefill_expert_us = us;
    }
    if engine.moe_compute_eff.is_some() {
        cfg.cost.moe_compute_eff = engine.moe_compute_eff;
    }
    if let Some(us) = engine.moe_layer_us {
        cfg.cost.moe_layer_us = us;
    }
    if let Some(s) = engine.moe_routing_skew {
        cfg.cost.moe_routing_skew = s;
    }
    cfg.model.name = Some(model.to_string());
    cfg.model.dtype = dtype;
    // NVIDIA's fp8 checkpoints quantize the KV cache too (`kv_cache_quant_algo: FP8`),
    // which TensorRT-LLM follows; vLLM and SGLang keep a 16-bit cache unless told.
    if row.backend == "trtllm" && (dtype == Dtype::Fp8 || dtype.is_fp4()) {
        cfg.model.kv_dtype = Some(Dtype::Fp8);
    }
    cfg.hardware.gpu = Some(gpu.to_string());
    cfg.engine.max_model_len = Some(row.isl + row.osl);
    cfg.workload.num_requests = Some(WAVES * u64::from(clients));
    cfg.workload.arrival = Some(ArrivalConfig::ClosedLoop {
        concurrency: clients,
        think_time_s: 0.0,
        ramp_up_s: 0.0,
        think_jitter_s: 0.0,
    });
    let lengths = |l: u32| match row.client {
        // InferenceX's random dataset: lengths uniform in [0.8 L, L].
        BenchClient::InferenceX => LengthDist::Uniform {
            min: (f64::from(l) * INFERENCEX_RANGE_RATIO) as u32,
            max: l,
        },
        // aiperf with zero spread: every request the same, so how the clients' requests
        // bunch into steps follows from their turnaround (`aiperf_settings`).
        BenchClient::Aiperf => LengthDist::Fixed { value: l },
    };
    cfg.workload.classes[0].prompt = Some(lengths(row.isl));
    cfg.workload.classes[0].output = Some(lengths(row.osl));
    cfg
}

/// One closed-loop run of `row`; `Err(why)` when the deployment cannot be configured (the
/// scenario checks' message: most often, it does not fit).
fn simulate(
    scn: &Scenario,
    row: &AggregateRow,
    p: &Planned,
    engine: EngineCost,
) -> Result<Result<analysis::Summary, String>, crate::SimError> {
    let gpu = p.gpu;
    // One replica and the clients it serves: a deployment of several replicas behind a
    // router records its per-replica share as `batch_size`, and under attention data
    // parallelism its per-rank share (the run simulates one rank with its share).
    let c = if p.dp > 1 {
        p.clients
    } else {
        row.batch_size.unwrap_or(p.clients)
    };
    let mut cfg = base_config(scn, row, (p.model, p.gpu, p.dtype), engine, c);
    cfg.hardware.tp = p.tp;
    cfg.hardware.dp = p.dp;
    cfg.hardware.ep = p.ep;
    engine_defaults(&mut cfg.engine, &row.backend);
    if row.backend == "sglang" {
        // The launch's memory fraction (the scripts' settings below may set their own):
        // aiconfigurator's generator lists CUDA graphs for 1 to the row's `batch_size`.
        let launch = SglangLaunch {
            tp: p.tp * p.dp,
            dp_attention: p.dp,
            cuda_graph_max_bs: (row.client == BenchClient::Aiperf)
                .then_some(row.batch_size.unwrap_or(c)),
            speculative: row.mtp_drafts.is_some(),
        };
        if let Some(g) = crate::catalog::find_gpu(gpu) {
            cfg.engine.gpu_memory_utilization =
                sglang_mem_fraction_static(&row.backend_version, g.mem_bytes, launch);
        }
    }
    match row.client {
        BenchClient::InferenceX if row.is_moe() => inferencex_moe_settings(&mut cfg, row, p),
        BenchClient::InferenceX => inferencex_dense_settings(&mut cfg, row, p.tp),
        // The generator's settings are per engine (per rank under attention data
        // parallelism, which no aiperf row has).
        BenchClient::Aiperf => aiperf_settings(
            &mut cfg,
            row,
            row.batch_size.unwrap_or(c),
            engine
                .aiperf_turnaround_ms
                .unwrap_or_else(|| aiperf_turnaround_ms(&row.backend)),
        ),
    }
    let acceptance = engine.mtp_acceptance.unwrap_or(MTP_ACCEPTANCE);
    if let Some(k) = row.mtp_drafts.filter(|_| acceptance > 0.0) {
        mtp_settings(&mut cfg, row, p, k, acceptance);
    }
    cfg.engine.max_num_seqs = cfg.engine.max_num_seqs.max(c);
    match engine.unrecorded {
        Unrecorded::AsRecorded => {}
        Unrecorded::HeldSlot => cfg.engine.max_num_seqs = c.saturating_sub(1).max(1),
        Unrecorded::PromptPool => {
            cfg.engine.enable_prefix_caching = true;
            for class in &mut cfg.workload.classes {
                class.prompt_pool = Some(crate::workload::PromptPool {
                    size: PROMPT_POOL,
                    sampling: crate::workload::PoolSampling::Random,
                });
            }
        }
        Unrecorded::OnePrompt => {
            let budget = Some((c + row.isl + row.osl + 64).div_ceil(32) * 32);
            if cfg.engine.max_prefill_tokens.is_some() {
                cfg.engine.max_prefill_tokens = budget;
            } else {
                cfg.engine.max_num_batched_tokens = budget;
            }
        }
    }
    // The simulator's prefill-first scheduler prefills whole prompts (SGLang chunks the
    // rare prompt beyond its 8,192 tokens): its budget must hold the longest.
    if cfg.engine.scheduler == engine::scheduler::SchedulerKind::Continuous {
        let budget = cfg.engine.max_num_batched_tokens.unwrap_or(8192);
        cfg.engine.max_num_batched_tokens = Some(budget.max(row.isl + row.osl));
    }
    // A deployment that does not fit (weights or KV) is skipped, not an error.
    let mut v = match scn.resolve_config(&row.id, cfg.clone()) {
        Ok(v) => v,
        Err(e) => return Ok(Err(e.msg)),
    };
    // The plan again at the share that gives the engine's own KV cache.
    let share = match row.backend.as_str() {
        // TensorRT-LLM gives the KV cache its free fraction (0.9 by default) of what
        // weights and activations leave: the same plan with `f + (1 - f) x (weights +
        // activations) / memory` of the GPU. aiconfigurator's deployments leave it what its
        // own model of them does.
        "trtllm" => {
            let reserved =
                (row.client == BenchClient::Aiperf).then(|| aiconfigurator_reserve(p.tp));
            Some(trtllm_memory_share_of(
                &v.memory,
                trtllm_free_fraction(row, p),
                reserved,
            ))
        }
        "sglang" => Some(sglang_memory_share(&v.memory)),
        _ => None,
    };
    if let Some(share) = share {
        cfg.engine.gpu_memory_utilization = share;
        v = match scn.resolve_config(&row.id, cfg) {
            Ok(v) => v,
            Err(e) => return Ok(Err(e.msg)),
        };
    }
    run_quietly(scn, &v).map(Ok)
}

/// Why a row that could not be configured is skipped: `unfit` when the scenario checks
/// found no room for its weights or KV cache, else their message without the row's id
/// (a layout the simulator refuses is reported as such, not counted as not fitting).
fn skip_reason(msg: &str, id: &str, unfit: &str) -> String {
    let msg = msg
        .strip_prefix(id)
        .and_then(|m| m.strip_prefix(": "))
        .unwrap_or(msg);
    const FIT: [&str; 5] = [
        "does not fit",
        "no memory left for the KV cache",
        "cannot hold one sequence",
        "larger than the KV cache",
        "fit in the",
    ];
    if FIT.iter().any(|f| msg.contains(f)) {
        unfit.to_string()
    } else {
        format!("refused by the scenario checks: {msg}")
    }
}

/// TensorRT-LLM's KV cache takes 0.9 of the memory that weights and activations leave:
/// the `gpu_memory_utilization` that gives `plan`'s deployment that cache.
pub(crate) fn trtllm_memory_share(plan: &crate::cost_model::MemoryPlan) -> f64 {
    trtllm_memory_share_of(plan, 0.9, None)
}

/// The share of the GPU that leaves the KV cache `free_fraction` of what weights and
/// activations leave (TensorRT-LLM's `kv_cache_config.free_gpu_memory_fraction`), the plan's
/// runtime reserve taken after it; with `reserved` bytes, `free_fraction` of what weights,
/// activations and those leave, and no runtime reserve of the plan's (they stand for it).
fn trtllm_memory_share_of(
    plan: &crate::cost_model::MemoryPlan,
    free_fraction: f64,
    reserved: Option<f64>,
) -> f64 {
    let held = plan.weight_bytes + plan.activation_bytes;
    match reserved {
        None => free_fraction + (1.0 - free_fraction) * held / plan.gpu_mem_bytes,
        // The plan's cache is `share x memory - held - runtime reserve`.
        Some(r) => {
            (free_fraction * (plan.gpu_mem_bytes - held - r) + held + plan.runtime_overhead_bytes)
                / plan.gpu_mem_bytes
        }
    }
}

/// What aiconfigurator's model of a TensorRT-LLM deployment holds besides weights,
/// activations and the KV cache, bytes per GPU at tensor-parallel degree `tp`: 3.5 GiB of
/// CUDA context, libraries and allocator (`other_mem` of its system files, the same on every
/// GPU it describes) and NCCL's buffers (`nccl_mem`: none at TP1, 342 MiB at TP2, 392 MiB
/// from TP4). Its authors checked the KV capacity their model gives (this reserve, with
/// their own estimates of weights and activations) against 72 TensorRT-LLM runs of
/// Qwen3-32B-FP8 and Llama-3.1-8B on H100 and GB300 (ai-dynamo/aiconfigurator, "add KV
/// cache capacity check", March 2026, by the author of the gap analysis the aiperf rows
/// come from: their `source_file` paths). Those rows whose KV cache binds (Qwen3-32B in fp8
/// at TP1: 4,096 x 512 at 64 clients, 2,048 x 256 and 2,048 x 512 at 128) queue as it
/// predicts; without it their TTFT came out 32-50% short. Not fitted: the value is
/// aiconfigurator's.
pub(crate) fn aiconfigurator_reserve(tp: u32) -> f64 {
    const MIB: f64 = 1024.0 * 1024.0;
    let nccl = match tp {
        0 | 1 => 0.0,
        2 => 342.0 * MIB,
        _ => 392.0 * MIB,
    };
    3.5 * 1024.0 * MIB + nccl
}

/// TensorRT-LLM's `free_gpu_memory_fraction` for `row`: 0.9 (its default), 0.8 in
/// aiconfigurator's aiperf rows (its template's), or what InferenceX's MoE scripts set (DeepSeek-R1: 0.8, 0.75 on H200 and for 8k prompts at TP4
/// on B200; gpt-oss: 0.85).
fn trtllm_free_fraction(row: &AggregateRow, p: &Planned) -> f64 {
    if row.client == BenchClient::Aiperf {
        return 0.8;
    }
    if !row.is_moe() {
        return 0.9;
    }
    if p.model.starts_with("gpt-oss") {
        0.85
    } else if p.gpu == "h200" || (p.dtype == Dtype::Fp8 && p.tp * p.dp == 4 && row.isl == 8192) {
        0.75
    } else {
        0.8
    }
}

/// Runs `v` on the cost model with the inline driver, writing nothing.
pub(crate) fn run_quietly(
    scn: &Scenario,
    v: &crate::scenario::Variant,
) -> Result<analysis::Summary, crate::SimError> {
    let r = run_variant(
        scn,
        v,
        BackendKind::Model,
        crate::driver::DriverKind::Inline,
        None,
        &indicatif::ProgressBar::hidden(),
        &|| {},
    )?;
    Ok(r.summary)
}

/// The scenario every row's run starts from (its model, GPU, engine and workload are
/// replaced per row).
pub(crate) fn template() -> Result<Scenario, crate::SimError> {
    template_with(None)
}

/// [`template`] with `calibration`'s `[cost]`.
fn template_with(calibration: Option<&Path>) -> Result<Scenario, crate::SimError> {
    let mut text = TEMPLATE.to_string();
    if let Some(c) = calibration {
        let abs = std::path::absolute(c).unwrap_or_else(|_| c.to_path_buf());
        text.push_str(&format!(
            "\n[cost]\ncalibration = {:?}\n",
            abs.display().to_string()
        ));
    }
    Ok(Scenario::from_text(Path::new("silicon.toml"), &text)?)
}

/// Simulates every row it can (in parallel) with the default cost model, or with
/// `calibration`'s `[cost]`.
pub fn silicon_checks(
    rows: &[AggregateRow],
    calibration: Option<&Path>,
) -> Result<(Vec<SiliconCheck>, Skipped), crate::SimError> {
    silicon_checks_with(rows, calibration, &|_, _| EngineCost::default())
}

/// [`silicon_checks`] with each engine's cost terms on each GPU (`cost(backend, gpu)`, the
/// catalog GPU's name).
pub fn silicon_checks_with(
    rows: &[AggregateRow],
    calibration: Option<&Path>,
    cost: &(dyn Fn(&str, &str) -> EngineCost + Sync),
) -> Result<(Vec<SiliconCheck>, Skipped), crate::SimError> {
    let scn = template_with(calibration)?;
    check_rows(
        rows.iter(),
        plan,
        |p| (p.model, p.gpu),
        |row, p| simulate(&scn, row, p, cost(&row.backend, p.gpu)),
        "does not fit the simulator's memory plan",
    )
}

/// Plans each row (what it resolves to, or why it is skipped), simulates the planned ones
/// in parallel (`Err(why)`: it could not be configured; counted as `unfit` when it does
/// not fit, else by the scenario checks' message), and returns the checks with the skipped
/// rows counted by reason.
pub(crate) fn check_rows<'a, P: Sync>(
    rows: impl Iterator<Item = &'a AggregateRow>,
    plan: impl Fn(&AggregateRow) -> Result<P, String>,
    names: impl Fn(&P) -> (&'static str, &'static str) + Sync,
    simulate: impl Fn(&AggregateRow, &P) -> Result<Result<analysis::Summary, String>, crate::SimError>
        + Sync,
    unfit: &str,
) -> Result<(Vec<SiliconCheck>, Skipped), crate::SimError> {
    let mut skipped: Skipped = Vec::new();
    let mut skip = |why: String| match skipped.iter_mut().find(|(w, _)| *w == why) {
        Some((_, n)) => *n += 1,
        None => skipped.push((why, 1)),
    };
    let mut todo = Vec::new();
    for row in rows {
        match plan(row) {
            Ok(p) => todo.push((row, p)),
            Err(why) => skip(why),
        }
    }
    let results: Vec<Result<Result<SiliconCheck, String>, crate::SimError>> = todo
        .par_iter()
        .map(|(row, p)| {
            let r = match simulate(row, p)? {
                Ok(r) => r,
                Err(msg) => return Ok(Err(skip_reason(&msg, &row.id, unfit))),
            };
            let (model, gpu) = names(p);
            Ok(Ok(SiliconCheck {
                row: (*row).clone(),
                model,
                gpu,
                ttft_ms: r.mean_ttft_ms,
                tpot_ms: r.mean_tpot_ms,
            }))
        })
        .collect();
    let mut checks = Vec::new();
    for r in results {
        match r? {
            Ok(c) => checks.push(c),
            Err(why) => skip(why),
        }
    }
    Ok((checks, skipped))
}

#[cfg(test)]
mod tests {
    use super::skip_reason;

    /// Qwen3-32B on one H100 in `dtype`, its KV cache too.
    fn qwen3_32b_on_h100(dtype: crate::catalog::Dtype) -> crate::cost_model::Deployment {
        crate::cost_model::Deployment {
            parallel: Default::default(),
            model: crate::catalog::find_model("qwen3-32b")
                .expect("model")
                .clone(),
            gpu: crate::catalog::find_gpu("h100-sxm").expect("gpu").clone(),
            tp: 1,
            pp: 1,
            dtype,
            kv_dtype: dtype,
        }
    }

    /// `d`'s memory plan at `util` with (block size, token budget, sequences, longest
    /// sequence) and the default runtime reserve.
    fn plan(
        d: &crate::cost_model::Deployment,
        util: f64,
        (block_size, budget, seqs, len): (u32, u32, u32, u32),
    ) -> crate::cost_model::MemoryPlan {
        crate::cost_model::memory_plan(
            d,
            &crate::cost_model::MemoryInputs {
                gpu_memory_utilization: util,
                block_size,
                max_num_batched_tokens: budget,
                max_num_seqs: seqs,
                max_model_len: len,
                runtime_overhead_bytes: 0.66 * f64::from(1u32 << 30),
                num_gpu_blocks_override: None,
                draft_weight_bytes: 0.0,
                draft_kv_bytes_per_token: 0.0,
                disable_hybrid: false,
            },
        )
        .expect("fits")
    }

    /// TensorRT-LLM's KV cache is its free fraction of what weights and activations leave,
    /// the plan's runtime reserve after it; aiconfigurator's deployments keep its reserve
    /// (3.5 GiB and NCCL's buffers) out before the fraction, and no runtime reserve.
    #[test]
    fn trtllm_kv_cache_is_the_free_fraction_of_what_is_left() {
        let d = qwen3_32b_on_h100(crate::catalog::Dtype::Fp8);
        let plan_at = |util: f64| plan(&d, util, (32, 5664, 64, 4608));
        let base = plan_at(0.9);
        let free = base.gpu_mem_bytes - base.weight_bytes - base.activation_bytes;
        let kv = |share: f64| plan_at(share).kv_budget_bytes;
        let plain = kv(super::trtllm_memory_share_of(&base, 0.8, None));
        assert!((plain - (0.8 * free - base.runtime_overhead_bytes)).abs() < 1.0);
        let r = super::aiconfigurator_reserve(1);
        assert_eq!(r, 3.5 * f64::from(1u32 << 30));
        let kept = kv(super::trtllm_memory_share_of(&base, 0.8, Some(r)));
        assert!(
            (kept - 0.8 * (free - r)).abs() < 1.0,
            "{kept} vs {}",
            0.8 * (free - r)
        );
        // NCCL's buffers from TP2.
        let mib = f64::from(1u32 << 20);
        assert_eq!(super::aiconfigurator_reserve(2) - r, 342.0 * mib);
        assert_eq!(super::aiconfigurator_reserve(8) - r, 392.0 * mib);
    }

    /// SGLang's memory fraction by version and launch, against the figures its heuristics
    /// give (worked by hand from `ServerArgs`), and the KV cache a plan at it leaves.
    #[test]
    fn sglang_memory_fraction_follows_its_version_heuristics() {
        use super::{sglang_mem_fraction_static as mfs, SglangLaunch};
        let gpu = |name: &str| crate::catalog::find_gpu(name).expect("gpu").mem_bytes;
        let (h100, h200, b200, gb200) = (gpu("h100-sxm"), gpu("h200"), gpu("b200"), gpu("gb200"));
        // 0.5.1 on an H100 (81,559 MiB): 9.5 GiB + TP/2.
        assert_eq!(mfs("0.5.1.post1", h100, SglangLaunch::plain(1)), 0.874);
        assert_eq!(mfs("0.5.1.post1", h100, SglangLaunch::plain(4)), 0.856);
        // On an H200, 12 GiB + TP/2; above 160 GiB, 32 GiB.
        assert_eq!(mfs("0.5.1.post1", h200, SglangLaunch::plain(8)), 0.886);
        assert_eq!(mfs("0.5.1-rc0.pre1", b200, SglangLaunch::plain(8)), 0.821);
        // 0.5.8 on an H100 at 16 clients (graphs 1-16): 512 + 1.5 x 8,192 + 2 x 16 + 128 MiB.
        let aiperf = |tp: u32, bs: u32| SglangLaunch {
            cuda_graph_max_bs: Some(bs),
            ..SglangLaunch::plain(tp)
        };
        assert_eq!(mfs("0.5.8.post1", h100, aiperf(1, 16)), 0.841);
        // 0.5.6 on an H200, TP8 at 512 clients: + 1,024 + 1,024 MiB.
        assert_eq!(mfs("0.5.6.post2", h200, aiperf(8, 512)), 0.897);
        // At one client: 512 + 12,288 + 2 + 128 MiB, above the 10 GiB floor.
        assert_eq!(mfs("0.5.6.post2", h200, aiperf(1, 1)), 0.91);
        // Unversioned (2026) on a GB200 (177,357 MiB) under attention DP8: 16,384-token
        // chunks, default graphs to 512, 4.5 MiB per graph batch and rank.
        let adp = SglangLaunch {
            dp_attention: 8,
            ..SglangLaunch::plain(8)
        };
        assert_eq!(mfs("", gb200, adp), 0.743);
        assert_eq!(mfs("nightly-dev-20260216-d3bae71e", gb200, adp), 0.743);
        // A draft model takes 2 GiB more.
        let spec = SglangLaunch {
            speculative: true,
            ..SglangLaunch::plain(8)
        };
        assert_eq!(mfs("0.5.9", b200, spec), 0.841);

        // The plan at the share it gives holds SGLang's cache: fraction x memory - weights
        // - the runtime reserve, the activations not taken again.
        let d = qwen3_32b_on_h100(crate::catalog::Dtype::Bf16);
        let plan_at = |util: f64| plan(&d, util, (16, 8192, 16, 4096));
        let base = plan_at(0.841);
        assert!(base.activation_bytes > 1e9, "{}", base.activation_bytes);
        let kv = plan_at(super::sglang_memory_share(&base)).kv_budget_bytes;
        let want = 0.841 * base.gpu_mem_bytes - base.weight_bytes - base.runtime_overhead_bytes;
        assert!((kv - want).abs() < 1.0, "{kv} vs {want}");
    }

    /// The engine keys InferenceX's MoE scripts set, on rows of the shipped `silicon.csv`.
    #[test]
    fn inferencex_moe_rows_run_with_their_scripts_settings() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("calibration/serving/aiconfigurator/silicon.csv");
        let rows = crate::observed::silicon::read(&path).expect("silicon.csv");
        let settings = |id: &str| {
            let row = rows.iter().find(|r| r.id == id).expect(id);
            let p = super::plan(row).expect("planned");
            let mut cfg = super::template().expect("template").base;
            super::engine_defaults(&mut cfg.engine, &row.backend);
            super::inferencex_moe_settings(&mut cfg, row, &p);
            cfg
        };
        // SGLang on B200: a poll every 10 decode steps below 16 clients, 30 from 16.
        let low = settings("dsr1_b200_sglang_fp4_agg_1024x1024_c4_cfg202");
        assert_eq!(low.engine.recv_interval, 10);
        assert_eq!(low.engine.max_num_batched_tokens, Some(16_384));
        assert_eq!(low.model.kv_dtype, Some(crate::catalog::Dtype::Fp8));
        let many = settings("qwen3_5_b200_sglang_fp8_agg_8192x1024_c64_cfg615");
        assert_eq!(many.engine.recv_interval, 30);
        assert_eq!(many.engine.adp_balance_timeout_iters, 0);
        // SGLang on H200: the scripts' chunks, memory fraction and request cap, no polling.
        let dsr1 = settings("dsr1_h200_sglang_fp8_agg_1024x1024_c4_cfg81");
        assert_eq!(dsr1.engine.max_num_batched_tokens, Some(32_768));
        assert_eq!(dsr1.engine.gpu_memory_utilization, 0.82);
        assert_eq!(dsr1.engine.max_num_seqs, 512);
        assert_eq!(dsr1.engine.recv_interval, 0);
        assert!(!dsr1.engine.enable_prefix_caching);
        let long = settings("dsr1_h200_sglang_fp8_agg_8192x1024_c4_cfg81");
        assert_eq!(long.engine.max_num_seqs, 256);
        let qwen = settings(
            "2026_03_25_qwen3_5_397b_h200_sxm_sglang_fp8_agg_1024x1024_c64_tp8_0_ep8_0_586",
        );
        assert_eq!(qwen.engine.max_num_batched_tokens, Some(16_384));
        assert_eq!(qwen.engine.gpu_memory_utilization, 0.8);
        assert_eq!(qwen.engine.max_num_seqs, 128);
        assert_eq!(qwen.model.kv_dtype, Some(crate::catalog::Dtype::Fp8));
        // TensorRT-LLM with attention data parallelism: the balancing's timeout.
        let adp = rows
            .iter()
            .find(|r| {
                r.backend == "trtllm"
                    && r.mode == "agg"
                    && r.attention_dp.unwrap_or(1) > 1
                    && r.model.contains("DeepSeek")
                    && r.client == crate::observed::silicon::BenchClient::InferenceX
            })
            .expect("an attention-DP DeepSeek row");
        let cfg = settings(&adp.id);
        assert_eq!(cfg.engine.adp_balance_timeout_iters, 60, "{}", adp.id);
        assert_eq!(cfg.engine.recv_interval, 0);
    }

    /// aiconfigurator's SGLang rows run prefill-first before 0.5.6 and with mixed chunks
    /// from it on, under the generator's `max_prefill_tokens = isl + 1500`.
    #[test]
    fn aiperf_sglang_rows_mix_chunks_from_0_5_6() {
        use engine::scheduler::SchedulerKind;
        for (version, mixes) in [
            ("0.5.1.post1", false),
            ("0.5.1-rc0.pre1", false),
            ("0.5.5.post2", false),
            ("0.5.6", true),
            ("0.5.6.post2", true),
            ("0.5.10.post1", true),
            ("1.0", true),
            ("nightly-dev-20260216-d3bae71e", true),
            ("", false),
        ] {
            assert_eq!(super::sglang_mixes_chunks(version), mixes, "{version:?}");
        }
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("calibration/serving/aiconfigurator/silicon.csv");
        let rows = crate::observed::silicon::read(&path).expect("silicon.csv");
        let settings = |version: &str| {
            let row = rows
                .iter()
                .find(|r| {
                    r.backend == "sglang"
                        && r.backend_version == version
                        && r.client == crate::observed::silicon::BenchClient::Aiperf
                        && r.mode == "agg"
                })
                .expect(version);
            super::plan(row).expect("planned");
            let mut cfg = super::template().expect("template").base;
            super::engine_defaults(&mut cfg.engine, &row.backend);
            let clients = row.batch_size.expect("batch_size");
            super::aiperf_settings(&mut cfg, row, clients, 0.0);
            (row.clone(), cfg)
        };
        let (_, old) = settings("0.5.1.post1");
        assert_eq!(old.engine.scheduler, SchedulerKind::Continuous);
        assert_eq!(old.engine.max_prefill_tokens, None);
        let (row, new) = settings("0.5.6.post2");
        assert_eq!(new.engine.scheduler, SchedulerKind::Chunked);
        assert_eq!(new.engine.max_prefill_tokens, Some(row.isl + 1500));
        assert_eq!(new.engine.max_num_seqs, row.batch_size.expect("batch_size"));
        assert_eq!(new.engine.max_num_batched_tokens, Some(8192));
    }

    /// InferenceX's GB200 rows labelled agg are the 44 multi-node disaggregated runs, all
    /// skipped with that reason; no other aggregated row is.
    #[test]
    fn inferencex_gb200_multinode_rows_are_skipped_as_such() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("calibration/serving/aiconfigurator/silicon.csv");
        let rows = crate::observed::silicon::read(&path).expect("silicon.csv");
        let flagged: Vec<_> = rows
            .iter()
            .filter(|r| super::is_mislabelled_multinode(r))
            .collect();
        assert_eq!(flagged.len(), 44);
        let trt = flagged.iter().filter(|r| r.backend == "trtllm").count();
        assert_eq!((trt, flagged.len() - trt), (27, 17));
        for r in &flagged {
            assert!(
                r.id.starts_with("2026_04_06_deepseek_r1_gb200_"),
                "{}",
                r.id
            );
            assert!(r.tp.is_some_and(|tp| tp >= 20), "{}", r.id);
            if r.repeats.is_none() {
                assert_eq!(super::plan(r).unwrap_err(), super::MULTINODE, "{}", r.id);
            }
        }
        // GB200 rows of aiconfigurator's own runs (aiperf) are single-node engines.
        assert!(rows.iter().any(|r| r.system.starts_with("gb200")
            && r.mode == "agg"
            && !super::is_mislabelled_multinode(r)
            && super::plan(r).is_ok()));
    }

    #[test]
    fn rows_that_do_not_fit_are_told_from_refused_layouts() {
        let unfit = "does not fit the simulator's memory plan";
        let fit = "row7: model does not fit: 140.0 GB of weights per GPU";
        assert_eq!(skip_reason(fit, "row7", unfit), unfit);
        let kv = "row7: no memory left for the KV cache: 79.00 GB usable - ...";
        assert_eq!(skip_reason(kv, "row7", unfit), unfit);
        let layout = "row7: hardware.ep: 3 does not divide the 256 experts";
        assert_eq!(
            skip_reason(layout, "row7", unfit),
            "refused by the scenario checks: hardware.ep: 3 does not divide the 256 experts"
        );
    }
}
