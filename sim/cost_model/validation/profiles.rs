//! Vidur's operator profiles against the cost model: the four linear layers of a Llama-2-7B
//! layer per token count and TP degree, and NCCL all-reduces per message size and GPU count
//! on one node.

use std::path::Path;

use super::{Check, Level};
use crate::catalog::Dtype;
use crate::cost_model::measurements::{
    column, gemm_profile_points, gpu, model, nccl_cost, read_rows, GemmPoint, ValidationError,
    EAGER_LAUNCH_US,
};
use crate::cost_model::{CostModel, CostParams, Deployment, Framework};

/// Vidur's operator profiles of Llama-2-7B: per number of tokens and TP degree, the layer's
/// four linear layers; and its NCCL all-reduce times per message size and GPU count.
pub fn profile_checks(dir: &Path) -> Result<Vec<Check>, ValidationError> {
    let mut out = gemm_point_checks(&gemm_profile_points(dir)?, &CostParams::default());
    for (g, file) in [
        ("a100-80gb", "vidur_a100_dgx_allreduce.csv"),
        ("h100-sxm", "vidur_h100_dgx_allreduce.csv"),
    ] {
        let path = dir.join(file);
        let rows = read_rows(&path)?;
        for (line, r) in rows {
            let num = |k: &str| column(&r, k, &path, line);
            let workers = num("num_workers")? as u32;
            // One node (NVLink, all workers on it); rows across nodes need the inter-node
            // network, which the catalog does not model.
            let per_node = num("devices_per_node")? as u32;
            if workers > 8 || per_node < workers || r.get("rank").map(String::as_str) != Some("0") {
                continue;
            }
            let size = num("size")?;
            let m = nccl_cost(
                model("llama-2-70b"),
                gpu(g),
                workers,
                Dtype::Fp16,
                Framework::VllmV1,
                Some(false),
            );
            out.push(Check {
                id: file.into(),
                what: format!("all-reduce of {size} bytes over {workers} GPUs, {g}"),
                how: "ring all-reduce".into(),
                level: Level::Operator,
                measured: num("time_stats.all_reduce.median")?,
                predicted: m.allreduce_s(size) * 1e3,
                unit: "ms",
            });
        }
    }
    Ok(out)
}

/// The profile rows predicted with `params` (eager launch cost: each operator is timed
/// alone in eager PyTorch).
pub(crate) fn gemm_point_checks(points: &[GemmPoint], params: &CostParams) -> Vec<Check> {
    points
        .iter()
        .map(|&(file, g, tokens, tp, measured)| {
            let m = CostModel::new(
                Deployment {
                    parallel: Default::default(),
                    model: model("llama-2-7b"),
                    gpu: gpu(g),
                    tp,
                    pp: 1,
                    dtype: Dtype::Bf16,
                    kv_dtype: Dtype::Bf16,
                },
                CostParams {
                    kernel_launch_us: Some(EAGER_LAUNCH_US),
                    ..params.clone()
                },
            );
            let c = m.step_cost(std::iter::once((0, tokens)), std::iter::empty(), 0, 1);
            Check {
                id: file.into(),
                what: format!("layer linears, {tokens} tokens, TP{tp}, {g}"),
                how: "QKV + O + gate/up + down of one layer".into(),
                level: Level::Operator,
                measured,
                predicted: c.linear_s / 32.0 * 1e3,
                unit: "ms",
            }
        })
        .collect()
}
