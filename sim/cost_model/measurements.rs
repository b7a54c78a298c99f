//! The measurement files the cost model is fitted to and checked against
//! (`calibration/calibration.csv`, Vidur's `vidur_*.csv` operator profiles), read into rows;
//! and the setups that simulate them: which catalog model and GPU, which framework, one
//! decode or prefill step. Shared by [`super::calibration`] and [`super::validation`].

use std::path::Path;

use super::{CostModel, CostParams, Deployment, Framework};
use crate::catalog::{find_gpu, find_model, Dtype, Gpu, ModelSpec};

/// Per-kernel launch and dispatch cost of eager PyTorch as Vidur's profiler sees it (each
/// operator timed alone with CUDA events), microseconds.
pub(crate) const EAGER_LAUNCH_US: f64 = 6.0;

/// Errors of reading the measurement files.
#[derive(Debug, thiserror::Error)]
pub enum ValidationError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A row could not be parsed.
    #[error("{path}: line {line}: {msg}")]
    Row {
        /// The file.
        path: String,
        /// 1-based line.
        line: u64,
        /// What is wrong.
        msg: String,
    },
}

pub(crate) fn model(name: &str) -> ModelSpec {
    find_model(name)
        .unwrap_or_else(|| unreachable!("catalog model {name}"))
        .clone()
}

pub(crate) fn gpu(name: &str) -> Gpu {
    find_gpu(name)
        .unwrap_or_else(|| unreachable!("catalog gpu {name}"))
        .clone()
}

pub(crate) fn cost(
    model: ModelSpec,
    gpu: Gpu,
    tp: u32,
    dtype: Dtype,
    framework: Framework,
) -> CostModel {
    nccl_cost(model, gpu, tp, dtype, framework, None)
}

/// A single-GPU Llama-2-7B cost model whose kernels carry eager PyTorch's launch cost (for
/// operators timed alone).
pub(crate) fn eager_cost(gpu: Gpu, dtype: Dtype) -> CostModel {
    CostModel::new(
        Deployment {
            parallel: Default::default(),
            model: model("llama-2-7b"),
            gpu,
            tp: 1,
            pp: 1,
            dtype,
            kv_dtype: Dtype::Bf16,
        },
        CostParams {
            kernel_launch_us: Some(EAGER_LAUNCH_US),
            ..CostParams::default()
        },
    )
}

/// A cost model whose all-reduces are NCCL's (`Some(false)`), or the framework's choice.
pub(crate) fn nccl_cost(
    model: ModelSpec,
    gpu: Gpu,
    tp: u32,
    dtype: Dtype,
    framework: Framework,
    custom_allreduce: Option<bool>,
) -> CostModel {
    CostModel::new(
        Deployment {
            parallel: Default::default(),
            model,
            gpu,
            tp,
            pp: 1,
            dtype,
            kv_dtype: if dtype.is_kv_format() && dtype != Dtype::Int8 {
                dtype
            } else {
                Dtype::Bf16
            },
        },
        CostParams {
            framework,
            custom_allreduce,
            ..CostParams::default()
        },
    )
}

/// Seconds of a decode step of `batch` sequences at context `ctx`.
pub(crate) fn decode_s(m: &CostModel, batch: u32, ctx: u32) -> f64 {
    m.step_cost(
        std::iter::empty(),
        std::iter::repeat_n((ctx, 1), batch as usize),
        batch,
        batch,
    )
    .seconds
}

/// Seconds of the prefill of one `len`-token prompt.
pub(crate) fn prefill_s(m: &CostModel, len: u32) -> f64 {
    m.step_cost(std::iter::once((0, len)), std::iter::empty(), 1, 1)
        .seconds
}

/// The values of a labelled half of a cell (`H100 0.034/0.074/0.322` -> the numbers).
pub(crate) fn unlabel(half: &str) -> &str {
    half.trim().split_once(' ').map_or(half, |(_, rest)| rest)
}

/// Splits a multi-valued cell (`a / b / c`).
pub(crate) fn values(cell: &str) -> Vec<f64> {
    cell.split('/')
        .filter_map(|v| v.split_whitespace().next()?.parse().ok())
        .collect()
}

pub(crate) type Row = std::collections::HashMap<String, String>;

/// The number in column `k` of a profile row.
pub(crate) fn column(r: &Row, k: &str, path: &Path, line: u64) -> Result<f64, ValidationError> {
    r.get(k)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| ValidationError::Row {
            path: path.display().to_string(),
            line,
            msg: format!("column `{k}` missing or not a number"),
        })
}

pub(crate) fn read_rows(path: &Path) -> Result<Vec<(u64, Row)>, ValidationError> {
    let shown = path.display().to_string();
    let mut rdr = csv::Reader::from_path(path).map_err(|e| ValidationError::Io {
        path: shown.clone(),
        source: std::io::Error::other(e.to_string()),
    })?;
    let headers = rdr
        .headers()
        .map_err(|e| ValidationError::Row {
            path: shown.clone(),
            line: 1,
            msg: e.to_string(),
        })?
        .clone();
    let mut out = Vec::new();
    for (i, rec) in rdr.records().enumerate() {
        let rec = rec.map_err(|e| ValidationError::Row {
            path: shown.clone(),
            line: i as u64 + 2,
            msg: e.to_string(),
        })?;
        let row: Row = headers
            .iter()
            .zip(rec.iter())
            .map(|(h, v)| (h.to_string(), v.to_string()))
            .collect();
        out.push((i as u64 + 2, row));
    }
    Ok(out)
}

/// Median of `values` (sorted in place; 0 when empty).
pub(crate) fn median_of(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// One row of Vidur's layer profiles: (file, GPU, tokens, TP, measured ms of the four
/// linear layers).
pub(crate) type GemmPoint = (&'static str, &'static str, u32, u32, f64);

/// The rows of Vidur's A100 and H100 layer profiles, read once.
pub(crate) fn gemm_profile_points(dir: &Path) -> Result<Vec<GemmPoint>, ValidationError> {
    let mut out = Vec::new();
    for (g, file) in [
        ("a100-80gb", "vidur_a100_Llama-2-7b-hf_mlp.csv"),
        ("h100-sxm", "vidur_h100_Llama-2-7b-hf_mlp.csv"),
    ] {
        let path = dir.join(file);
        for (line, r) in read_rows(&path)? {
            let num = |k: &str| column(&r, k, &path, line);
            let measured = num("time_stats.attn_pre_proj.median")?
                + num("time_stats.attn_post_proj.median")?
                + num("time_stats.mlp_up_proj.median")?
                + num("time_stats.mlp_down_proj.median")?;
            out.push((
                file,
                g,
                num("num_tokens")? as u32,
                num("num_tensor_parallel_workers")? as u32,
                measured,
            ));
        }
    }
    Ok(out)
}

/// Single-node rank-0 rows of an NCCL profile: (GPUs, bytes, measured ms).
pub(crate) fn allreduce_rows(path: &Path) -> Result<Vec<(u32, f64, f64)>, ValidationError> {
    let mut out = Vec::new();
    for (line, r) in read_rows(path)? {
        let num = |k: &str| column(&r, k, path, line);
        let workers = num("num_workers")? as u32;
        let per_node = num("devices_per_node")? as u32;
        if workers > 8 || per_node < workers || r.get("rank").map(String::as_str) != Some("0") {
            continue;
        }
        out.push((workers, num("size")?, num("time_stats.all_reduce.median")?));
    }
    Ok(out)
}

/// The text of a measurement file, and its path as errors show it.
pub(crate) fn read_text(path: &Path) -> Result<(String, String), ValidationError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ValidationError::Io {
        path: shown.clone(),
        source,
    })?;
    Ok((text, shown))
}
