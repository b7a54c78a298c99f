//! The published rows of `calibration/calibration.csv`, each simulated as its setup
//! describes: batch-1 decode speeds, FasterTransformer's prefill and decode, Splitwise's
//! steps under the fitted `vllm-2023` profile, operator rows timed alone, and TensorRT-LLM's
//! offline throughput (V14) through the whole engine.

use std::path::Path;

use super::{Check, Level};
use crate::catalog::{Dtype, ModelSpec};
use crate::cost_model::calibration::{splitwise_cost, splitwise_rows};
use crate::cost_model::measurements::{
    cost, decode_s, eager_cost, gpu, model, nccl_cost, prefill_s, read_text, unlabel, values,
    ValidationError,
};
use crate::cost_model::{CostParams, Framework};

/// The 13B GPT of kipply's FasterTransformer measurements (40 layers, hidden 5120, 40
/// heads, a 4h GELU MLP): a Llama-shaped spec whose 3-matrix MLP of width 8h/3 has the
/// same parameters and FLOPs.
fn gpt_13b() -> ModelSpec {
    ModelSpec {
        name: "gpt-13b",
        hf_id: "kipply test-13b",
        layers: 40,
        hidden: 5120,
        heads: 40,
        kv_heads: 40,
        head_dim: 128,
        intermediate: 13653,
        vocab: 50257,
        max_position: 2048,
        tied_embeddings: true,
        rope_theta: 10000.0,
        sliding_window: None,
        num_experts: 1,
        experts_per_token: 1,
        gated_mlp: true,
        position_embeddings: 0,
        arch: Default::default(),
    }
}

/// Checks for the rows of `calibration.csv` (the file's own values; the mapping from each
/// row's setup to a simulation is written out per row, one function per source).
pub fn calibration_checks(path: &Path) -> Result<Vec<Check>, ValidationError> {
    let (text, shown) = read_text(path)?;
    let mut rdr = csv::Reader::from_reader(text.as_bytes());
    let mut out = Vec::new();
    for (i, rec) in rdr.records().enumerate() {
        let line = i as u64 + 2;
        let rec = rec.map_err(|e| ValidationError::Row {
            path: shown.clone(),
            line,
            msg: e.to_string(),
        })?;
        let id = rec.get(0).unwrap_or_default().to_string();
        let value = rec.get(11).unwrap_or_default();
        let rows = match id.as_str() {
            "V01" | "V02" | "V03" => gpt_fast(&id, value),
            "V07" => faster_transformer(value),
            "V22" | "V23" => Ok(splitwise(&id, value)),
            "V27" | "V28" => Ok(vidur_linears(&id, value)),
            "V30" => Ok(nccl_allreduce(value)),
            "V31" => Ok(llmcompass_gemm(value)),
            // Offline throughput needs the engine: `throughput_checks` simulates it.
            "V14" => Ok(Vec::new()),
            other => {
                return Err(ValidationError::Row {
                    path: shown.clone(),
                    line,
                    msg: format!("row {other} has no simulation mapping yet"),
                })
            }
        };
        let rows = rows.map_err(|msg| ValidationError::Row {
            path: shown.clone(),
            line,
            msg: format!("{id}: {msg}: `{value}`"),
        })?;
        out.extend(
            rows.into_iter()
                .map(|(what, how, level, measured, predicted, unit)| Check {
                    id: id.clone(),
                    what,
                    how: how.to_string(),
                    level,
                    measured,
                    predicted,
                    unit,
                }),
        );
    }
    Ok(out)
}

/// One check of a row, before it gets the row's id: what was measured, how it is
/// simulated, the level, the measured and predicted values, their unit.
type RowCheck = (String, &'static str, Level, f64, f64, &'static str);

/// V01-V03: gpt-fast's batch-1 decode of Llama-2-7B on an A100 (bf16, int8, int4).
fn gpt_fast(id: &str, value: &str) -> Result<Vec<RowCheck>, String> {
    let dtype = match id {
        "V01" => Dtype::Bf16,
        "V02" => Dtype::Int8,
        _ => Dtype::Int4G32,
    };
    let measured = values(value).first().copied().ok_or("no value")?;
    // gpt-fast: torch.compile with CUDA graphs, negligible framework overhead.
    let m = cost(
        model("llama-2-7b"),
        gpu("a100-80gb"),
        1,
        dtype,
        Framework::TensorrtLlm,
    );
    let tok_s = 1.0 / decode_s(&m, 1, 105);
    Ok(vec![(
        format!("Llama-2-7B {} batch-1 decode, A100-80GB", dtype.as_str()),
        "one decode step at context 105 (5-token prompt + half of 200), tokens/s = 1/step",
        Level::EndToEnd,
        measured,
        tok_s,
        "tok/s",
    )])
}

/// V07: FasterTransformer's 13B GPT prefill and decode on an A100-40GB.
fn faster_transformer(value: &str) -> Result<Vec<RowCheck>, String> {
    let v = values(value);
    let (Some(&pf), Some(&dc)) = (v.first(), v.get(1)) else {
        return Err("expected prefill / decode".into());
    };
    let m = cost(
        gpt_13b(),
        gpu("a100-40gb"),
        1,
        Dtype::Fp16,
        Framework::TensorrtLlm,
    );
    Ok(vec![
        (
            "13B GPT 512-token prefill, A100-40GB fp16 (FasterTransformer)".into(),
            "one prefill step of 512 tokens",
            Level::EndToEnd,
            pf,
            prefill_s(&m, 512) * 1e3,
            "ms",
        ),
        (
            "13B GPT decode per token, batch 1".into(),
            "one decode step at context 517",
            Level::EndToEnd,
            dc,
            decode_s(&m, 1, 517) * 1e3,
            "ms",
        ),
    ])
}

/// V22, V23: Splitwise's decode and prefill steps under the fitted `vllm-2023` profile.
fn splitwise(id: &str, value: &str) -> Vec<RowCheck> {
    let m = splitwise_cost(&CostParams {
        framework: Framework::Vllm2023,
        ..CostParams::default()
    });
    splitwise_rows(id, value)
        .into_iter()
        .map(|row| {
            let (what, how) = row.describe();
            (
                what,
                how,
                Level::EndToEnd,
                row.measured,
                row.predict(&m) * 1e3,
                "ms",
            )
        })
        .collect()
}

/// V27, V28: Vidur's profiles of one Llama-2-7B layer's linears (A100, H100).
fn vidur_linears(id: &str, value: &str) -> Vec<RowCheck> {
    let g = if id == "V27" { "a100-80gb" } else { "h100-sxm" };
    // Vidur's profiler: operators timed alone in eager PyTorch.
    let m = eager_cost(gpu(g), Dtype::Bf16);
    [1u32, 4096]
        .into_iter()
        .zip(values(value))
        .map(|(tokens, measured)| {
            let c = m.step_cost(std::iter::once((0, tokens)), std::iter::empty(), 0, 1);
            (
                format!("Llama-2-7B layer linears, {tokens} tokens, {g}"),
                "QKV + O + gate/up + down of one layer (linear time / 32 layers)",
                Level::Operator,
                measured,
                c.linear_s / 32.0 * 1e3,
                "ms",
            )
        })
        .collect()
}

/// V30: NCCL all-reduces over 8 GPUs (A100 and H100 DGX), as Vidur profiled them.
fn nccl_allreduce(value: &str) -> Vec<RowCheck> {
    let mut out = Vec::new();
    for (half, g) in value.split(';').zip(["a100-80gb", "h100-sxm"]) {
        // Vidur's profiler times torch.distributed, i.e. NCCL.
        let m = nccl_cost(
            model("llama-2-70b"),
            gpu(g),
            8,
            Dtype::Fp16,
            Framework::VllmV1,
            Some(false),
        );
        for (mib, measured) in [1.0, 8.0, 64.0].into_iter().zip(values(unlabel(half))) {
            out.push((
                format!("all-reduce of {mib} MiB over 8 GPUs, {g}"),
                "ring all-reduce: 2 (n-1)/n x bytes / (link x efficiency) + latency",
                Level::Operator,
                measured,
                m.allreduce_s(mib * 1024.0 * 1024.0) * 1e3,
                "ms",
            ));
        }
    }
    out
}

/// V31: LLMCompass's square-ish fp16 GEMMs on an A100, timed alone.
fn llmcompass_gemm(value: &str) -> Vec<RowCheck> {
    // LLMCompass times torch.matmul alone, eagerly.
    let m = eager_cost(gpu("a100-80gb"), Dtype::Fp16);
    [64.0, 512.0, 4096.0, 16384.0]
        .into_iter()
        .zip(values(value))
        .map(|(mm, measured)| {
            (
                format!("GEMM {mm} x 12288 x 12288 fp16, A100"),
                "one GEMM on the linear-layer roofline",
                Level::Operator,
                measured,
                m.gemm_s(mm, 12288.0, 12288.0) * 1e3,
                "ms",
            )
        })
        .collect()
}

/// Row V14 (TensorRT-LLM's offline throughput of Llama-3.1-8B FP8 on an H100 and an H200):
/// simulated with the engine, as `trtllm-bench` runs it: every request at once, fixed
/// input and output lengths, in-flight batching with chunked prefill.
pub fn throughput_checks(path: &Path) -> Result<Vec<Check>, ValidationError> {
    let (text, shown) = read_text(path)?;
    let Some(line) = text.lines().find(|l| l.starts_with("V14,")) else {
        return Ok(Vec::new());
    };
    // The value cell: "H100 a / b / c ; H200 d / e / f".
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(false)
        .from_reader(line.as_bytes());
    let cell = rdr
        .records()
        .next()
        .and_then(Result::ok)
        .and_then(|r| r.get(11).map(str::to_string))
        .unwrap_or_default();
    let mut out = Vec::new();
    for (half, g) in cell.split(';').zip(["h100-sxm", "h200"]) {
        let measured = values(unlabel(half));
        for ((input, output), m) in [(128u32, 128u32), (2048, 128), (2048, 2048)]
            .into_iter()
            .zip(measured)
        {
            let requests = if output >= 2048 { 1000 } else { 3000 };
            let toml = format!(
                r#"
name = "v14"
seed = 1
[model]
name = "llama-3-8b"
dtype = "fp8"
kv_dtype = "fp8"
[hardware]
gpu = "{g}"
[engine]
scheduler = "chunked"
max_num_seqs = 1024
max_num_batched_tokens = 8192
max_model_len = 8192
gpu_memory_utilization = 0.95
enable_prefix_caching = false
[cost]
framework = "tensorrt-llm"
[workload]
num_requests = {requests}
arrival = {{ process = "all-at-once" }}
[[workload.class]]
name = "fixed"
prompt = {{ dist = "fixed", value = {input} }}
output = {{ dist = "fixed", value = {output} }}
"#
            );
            let tmp = std::env::temp_dir().join(format!(
                "sim-v14-{}-{g}-{input}-{output}.toml",
                std::process::id()
            ));
            std::fs::write(&tmp, toml).map_err(|source| ValidationError::Io {
                path: tmp.display().to_string(),
                source,
            })?;
            let scn = crate::scenario::Scenario::load(&tmp, None);
            let _ = std::fs::remove_file(&tmp);
            let scn = scn.map_err(|e| ValidationError::Row {
                path: shown.clone(),
                line: 0,
                msg: format!("V14 scenario: {e}"),
            })?;
            let Some(variant) = scn.variants.first() else {
                continue;
            };
            let bar = indicatif::ProgressBar::hidden();
            let r = crate::run::run_variant(
                &scn,
                variant,
                crate::run::BackendKind::Model,
                crate::driver::DriverKind::Inline,
                None,
                &bar,
                &|| {},
            )
            .map_err(|e| ValidationError::Row {
                path: shown.clone(),
                line: 0,
                msg: format!("V14 run: {e}"),
            })?;
            out.push(Check {
                id: "V14".into(),
                what: format!("Llama-3.1-8B FP8 max throughput, {input} in / {output} out, {g} (TensorRT-LLM)"),
                how: format!("engine run: {requests} requests at once, chunked prefill (8,192-token budget, 1,024 sequences), fp8 weights and KV, tensorrt-llm overheads"),
                level: Level::EndToEnd,
                measured: m,
                predicted: r.summary.output_throughput,
                unit: "tok/s",
            });
        }
    }
    Ok(out)
}
