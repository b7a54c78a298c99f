//! LLMServingSim's operator profiles of one model on one GPU
//! (`profiles/<GPU>/<org>/<model>/<variant>/`, its profiler for vLLM 0.19): `meta.yaml` (the
//! model, the GPU's device name, the vLLM version, the tensor-parallel degrees profiled) and,
//! per degree, `tp<N>/` with the times of one layer's operators on one GPU's shard:
//! - `dense.csv` (`layer,tokens,time_us`): the linear layers (`qkv_proj`, `o_proj`,
//!   `gate_up_proj`, `down_proj`) and the element-wise kernels (`layernorm`, twice a layer,
//!   `rotary_emb`, `act_fn`, `qk_norm`), plus `embedding` and `final_layernorm`, once a step;
//! - `attention.csv` (`prefill_chunk,kv_prefill,n_decode,kv_decode,time_us`): one layer's
//!   attention over a prefill chunk with its cached KV and `n_decode` decodes of
//!   `kv_decode` tokens each, run as one kernel;
//! - `per_sequence.csv` (`layer,sequences,time_us`): `lm_head` and `sampler` by the number
//!   of sequences sampled;
//! - `moe.csv` (`tokens,activated_experts,time_us`), a mixture of experts' only: one MoE
//!   layer's routed experts over `tokens` tokens whose top-k choices fall on
//!   `activated_experts` distinct experts (its `dense.csv` then has no `gate_up_proj` or
//!   `down_proj`: the model has no dense MLP).
//!
//! The `skew*.csv` files (attention over unequal contexts) are not read. In: the variant
//! folder and the degree; out: an [`OperatorProfile`] with every row checked; errors name
//! the file, line and field.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::ObservedError;

/// Operators that run once per layer (`layernorm` twice).
pub const LAYER_OPS: [&str; 8] = [
    "qkv_proj",
    "o_proj",
    "gate_up_proj",
    "down_proj",
    "layernorm",
    "rotary_emb",
    "act_fn",
    "qk_norm",
];

/// Operators that run once per step.
pub const STEP_OPS: [&str; 2] = ["embedding", "final_layernorm"];

/// Linear layers a dense model's profile must have.
const REQUIRED_OPS: [&str; 5] = [
    "qkv_proj",
    "o_proj",
    "gate_up_proj",
    "down_proj",
    "layernorm",
];

/// Linear layers a mixture of experts' profile (one with `moe.csv`) must have: its MLPs are
/// the experts.
const REQUIRED_MOE_OPS: [&str; 3] = ["qkv_proj", "o_proj", "layernorm"];

/// What `meta.yaml` says about the profile (other keys are ignored).
#[derive(Debug, Deserialize)]
struct Meta {
    model: String,
    gpu: String,
    #[serde(default)]
    hardware: Option<String>,
    #[serde(default)]
    variant: Option<String>,
    #[serde(default)]
    vllm_version: Option<String>,
    #[serde(default)]
    tp_degrees: Vec<u32>,
}

/// One model's operators on one GPU at one tensor-parallel degree, in seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct OperatorProfile {
    /// The folder of this degree's CSV files.
    pub dir: PathBuf,
    /// The model profiled (a Hugging Face id).
    pub model: String,
    /// The GPU's CUDA device name.
    pub gpu: String,
    /// The profiler's name for the GPU (`RTX4090`).
    pub hardware: Option<String>,
    /// Weight format profiled (`bf16`).
    pub variant: Option<String>,
    /// vLLM version profiled.
    pub vllm_version: Option<String>,
    /// Tensor-parallel degree.
    pub tp: u32,
    /// Each dense operator's times by tokens, sorted by tokens.
    pub dense: BTreeMap<String, Vec<(u32, f64)>>,
    /// Attention rows: `[prefill_chunk, kv_prefill, n_decode, kv_decode]` and seconds.
    pub attention: Vec<([u32; 4], f64)>,
    /// `lm_head` and `sampler` times by sequences, sorted by sequences.
    pub per_sequence: BTreeMap<String, Vec<(u32, f64)>>,
    /// A mixture of experts' `moe.csv`: `[tokens, activated_experts]` and seconds of one MoE
    /// layer's routed experts (`None`: a dense model's profile).
    pub moe: Option<Vec<([u32; 2], f64)>>,
}

/// Reads the profile in `dir` (the folder of `meta.yaml`) at tensor-parallel degree `tp`.
pub fn open(dir: &Path, tp: u32) -> Result<OperatorProfile, ObservedError> {
    let meta_path = dir.join("meta.yaml");
    let text = std::fs::read_to_string(&meta_path)
        .map_err(|e| ObservedError::new(&meta_path, format!("cannot read: {e}")))?;
    let meta: Meta = serde_yaml_ng::from_str(&text).map_err(|e| ObservedError {
        path: meta_path.clone(),
        line: e.location().map(|l| l.line() as u64),
        field: None,
        message: crate::messages::concise(&e.to_string()),
    })?;
    let tp_dir = dir.join(format!("tp{tp}"));
    if !tp_dir.is_dir() {
        let have: Vec<String> = meta.tp_degrees.iter().map(|t| t.to_string()).collect();
        return Err(ObservedError::at(
            &meta_path,
            None,
            "tp_degrees",
            format!(
                "no profile at tensor-parallel degree {tp} (folder {} is missing; profiled: {})",
                tp_dir.display(),
                if have.is_empty() {
                    "none listed".to_string()
                } else {
                    have.join(", ")
                }
            ),
        ));
    }
    let dense_path = tp_dir.join("dense.csv");
    let known: Vec<&str> = LAYER_OPS.iter().chain(&STEP_OPS).copied().collect();
    let dense = by_size(&dense_path, "tokens", &known)?;
    let moe_path = tp_dir.join("moe.csv");
    let moe = if moe_path.exists() {
        Some(moe(&moe_path)?)
    } else {
        None
    };
    let (required, kind): (&[&str], _) = if moe.is_some() {
        (
            &REQUIRED_MOE_OPS,
            "a mixture of experts' profile (with moe.csv)",
        )
    } else {
        (&REQUIRED_OPS, "a dense model's profile (no moe.csv)")
    };
    for op in required {
        if !dense.contains_key(*op) {
            return Err(ObservedError::at(
                &dense_path,
                None,
                "layer",
                format!("no rows of `{op}`: {kind} has {}", required.join(", ")),
            ));
        }
    }
    let seq_path = tp_dir.join("per_sequence.csv");
    let per_sequence = by_size(&seq_path, "sequences", &["lm_head", "sampler"])?;
    if !per_sequence.contains_key("lm_head") {
        return Err(ObservedError::at(
            &seq_path,
            None,
            "layer",
            "no rows of `lm_head`",
        ));
    }
    let attention = attention(&tp_dir.join("attention.csv"))?;
    Ok(OperatorProfile {
        dir: tp_dir,
        model: meta.model,
        gpu: meta.gpu,
        hardware: meta.hardware,
        variant: meta.variant,
        vllm_version: meta.vllm_version,
        tp,
        dense,
        attention,
        per_sequence,
        moe,
    })
}

/// Opens a CSV file and checks its header is exactly `columns`.
fn reader(path: &Path, columns: &[&str]) -> Result<csv::Reader<std::fs::File>, ObservedError> {
    let mut rd = csv::ReaderBuilder::new()
        .from_path(path)
        .map_err(|e| ObservedError::new(path, format!("cannot read: {e}")))?;
    let header = rd
        .headers()
        .map_err(|e| ObservedError::at(path, Some(1), "header", e.to_string()))?;
    let got: Vec<&str> = header.iter().collect();
    if got != columns {
        return Err(ObservedError::at(
            path,
            Some(1),
            "header",
            format!(
                "expected columns `{}`, got `{}`",
                columns.join(","),
                got.join(",")
            ),
        ));
    }
    Ok(rd)
}

/// A non-negative integer size in column `field`.
fn size(path: &Path, line: u64, field: &str, v: &str) -> Result<u32, ObservedError> {
    v.trim().parse::<u32>().map_err(|_| {
        ObservedError::at(
            path,
            Some(line),
            field,
            format!("expected a non-negative integer, got `{v}`"),
        )
    })
}

/// A positive, finite time in microseconds, as seconds.
fn time_s(path: &Path, line: u64, v: &str) -> Result<f64, ObservedError> {
    match v.trim().parse::<f64>() {
        Ok(t) if t > 0.0 && t.is_finite() => Ok(t * 1e-6),
        _ => Err(ObservedError::at(
            path,
            Some(line),
            "time_us",
            format!("expected a positive number of microseconds, got `{v}`"),
        )),
    }
}

/// A `layer,<size>,time_us` file of the operators `known`: each operator's times, sorted by
/// size, sizes unique and above 0.
fn by_size(
    path: &Path,
    size_col: &str,
    known: &[&str],
) -> Result<BTreeMap<String, Vec<(u32, f64)>>, ObservedError> {
    let mut rd = reader(path, &["layer", size_col, "time_us"])?;
    let mut out: BTreeMap<String, Vec<(u32, f64)>> = BTreeMap::new();
    for (i, rec) in rd.records().enumerate() {
        let line = i as u64 + 2;
        let rec = rec.map_err(|e| ObservedError::at(path, Some(line), "row", e.to_string()))?;
        let n = size(path, line, size_col, &rec[1])?;
        if n == 0 {
            return Err(ObservedError::at(
                path,
                Some(line),
                size_col,
                "must be at least 1",
            ));
        }
        let t = time_s(path, line, &rec[2])?;
        let op = rec[0].trim();
        if !known.contains(&op) {
            return Err(ObservedError::at(
                path,
                Some(line),
                "layer",
                format!(
                    "operator `{op}` is not one the cost model places (known: {})",
                    known.join(", ")
                ),
            ));
        }
        let rows = out.entry(op.to_string()).or_default();
        if rows.iter().any(|&(m, _)| m == n) {
            return Err(ObservedError::at(
                path,
                Some(line),
                size_col,
                format!("`{}` at {n} is measured twice", &rec[0]),
            ));
        }
        rows.push((n, t));
    }
    for rows in out.values_mut() {
        rows.sort_by_key(|&(n, _)| n);
    }
    if out.is_empty() {
        return Err(ObservedError::new(path, "holds no rows"));
    }
    Ok(out)
}

/// A table of measured points: `N` size columns (`cols`, then `time_us`), each row checked
/// by `check` (its sizes and line) and each point measured once, at least one row.
fn points<const N: usize>(
    path: &Path,
    cols: [&str; N],
    check: impl Fn([u32; N], u64) -> Result<(), ObservedError>,
) -> Result<Vec<([u32; N], f64)>, ObservedError> {
    let header: Vec<&str> = cols.iter().copied().chain(["time_us"]).collect();
    let mut rd = reader(path, &header)?;
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (i, rec) in rd.records().enumerate() {
        let line = i as u64 + 2;
        let rec = rec.map_err(|e| ObservedError::at(path, Some(line), "row", e.to_string()))?;
        let mut k = [0u32; N];
        for (j, slot) in k.iter_mut().enumerate() {
            *slot = size(path, line, cols[j], &rec[j])?;
        }
        check(k, line)?;
        if !seen.insert(k) {
            return Err(ObservedError::at(
                path,
                Some(line),
                "row",
                format!("the point {k:?} is measured twice"),
            ));
        }
        out.push((k, time_s(path, line, &rec[N])?));
    }
    if out.is_empty() {
        return Err(ObservedError::new(path, "holds no rows"));
    }
    Ok(out)
}

/// `moe.csv`: tokens and activated experts at least 1, each point once.
fn moe(path: &Path) -> Result<Vec<([u32; 2], f64)>, ObservedError> {
    let cols = ["tokens", "activated_experts"];
    points(path, cols, |k, line| match k.iter().position(|&n| n == 0) {
        Some(j) => Err(ObservedError::at(
            path,
            Some(line),
            cols[j],
            "must be at least 1",
        )),
        None => Ok(()),
    })
}

/// `attention.csv`: rows with some work, each point once.
fn attention(path: &Path) -> Result<Vec<([u32; 4], f64)>, ObservedError> {
    points(
        path,
        ["prefill_chunk", "kv_prefill", "n_decode", "kv_decode"],
        |k, line| {
            if k[0] == 0 && k[2] == 0 {
                return Err(ObservedError::at(
                    path,
                    Some(line),
                    "prefill_chunk",
                    "a row needs a prefill chunk or decodes",
                ));
            }
            if k[2] > 0 && k[3] == 0 {
                return Err(ObservedError::at(
                    path,
                    Some(line),
                    "kv_decode",
                    "decodes attend at least one token",
                ));
            }
            Ok(())
        },
    )
}
