//! Fitting the cost model's parameters (`sim calibrate`), each fit by exhaustive search over
//! a fixed grid so that it is reproducible:
//!
//! - GEMM efficiencies and the compute/memory overlap to Vidur's layer profiles, and each
//!   GPU's all-reduce efficiency and latency to its NCCL profile ([`calibrate`]); or the
//!   GEMM efficiencies to a user's measured GEMMs ([`calibrate_points`]). The shipped
//!   defaults are the first fit ([`fit_toml`] writes it as a `[cost]` table).
//! - Early vLLM's framework profile to Splitwise's rows ([`splitwise`]).
//! - Efficiencies and the step overhead to whole steps measured on the CUDA runtime
//!   ([`steps`], `sim calibrate --backend cuda` or `--steps`).
//! - The terms a replay feels to real runs, per GPU, held out by time and by run
//!   ([`replayed`], `sim calibrate --observed` on runs).

use std::fmt::Write as _;
use std::path::Path;

use super::measurements::{
    allreduce_rows, column, gemm_profile_points, gpu, median_of, model, nccl_cost, read_rows,
    ValidationError, EAGER_LAUNCH_US,
};
use super::validation::{error_stats, gemm_point_checks};
use super::{CostModel, CostParams, Deployment, Framework};
use crate::catalog::{find_gpu, Dtype};

pub mod efficiency;
pub mod memo;
pub mod memory;
pub mod moe_engines;
pub mod observed;
pub mod replayed;
pub mod served;
pub mod splitwise;
pub mod steps;
pub mod turnaround;
pub mod uncertainty;

pub use splitwise::{
    fit_vllm_2023, splitwise_measurements, vllm_2023_held_out, FrameworkFit, SplitwiseRow,
    MAX_E2E_ERROR,
};
pub(crate) use splitwise::{splitwise_cost, splitwise_rows};

/// The GEMM grid of `sim calibrate`: compute efficiency 0.60-0.95 and memory efficiency
/// 0.70-0.95 in steps of 0.05, and the overlap exponents; `median_error` scores one
/// setting. Returns (error, compute eff, memory eff, exponent) of the best, the first on
/// ties (a fixed order, so the fit is reproducible).
fn grid_fit(mut median_error: impl FnMut(&CostParams) -> f64) -> (f64, f64, f64, Option<f64>) {
    let mut best = (f64::INFINITY, 0.0, 0.0, None);
    for ec in (12..=19).map(|i| f64::from(i) / 20.0) {
        for em in (14..=19).map(|i| f64::from(i) / 20.0) {
            for p in [None, Some(1.0), Some(1.5), Some(2.0), Some(3.0)] {
                let params = CostParams {
                    gemm_compute_eff: ec,
                    gemm_memory_eff: em,
                    overlap_exponent: p,
                    kernel_launch_us: Some(EAGER_LAUNCH_US),
                    ..CostParams::default()
                };
                let e = median_error(&params);
                if e < best.0 - 1e-12 {
                    best = (e, ec, em, p);
                }
            }
        }
    }
    best
}

/// Efficiencies fitted by [`calibrate`].
#[derive(Debug, Clone, PartialEq)]
pub struct Fit {
    /// `gemm_compute_eff`.
    pub gemm_compute_eff: f64,
    /// `gemm_memory_eff`.
    pub gemm_memory_eff: f64,
    /// `overlap_exponent` (`None`: the plain maximum).
    pub overlap_exponent: Option<f64>,
    /// Median absolute error of the GEMM profiles at the fit.
    pub gemm_median_error: f64,
    /// Per GPU: (catalog name, all-reduce efficiency, latency in us, median error).
    pub allreduce: Vec<(String, f64, f64, f64)>,
    /// Early vLLM's profile fitted to Splitwise's rows of calibration.csv, when the folder
    /// has one.
    pub vllm_2023: Option<FrameworkFit>,
}

/// Fits the cost model's GEMM efficiencies and overlap exponent to Vidur's layer profiles
/// (median absolute error over every row of both GPUs), and each GPU's all-reduce
/// efficiency and latency to its NCCL profile, by exhaustive search over fixed grids (so
/// the fit is reproducible). The shipped defaults are this fit.
pub fn calibrate(dir: &Path) -> Result<Fit, ValidationError> {
    let points = gemm_profile_points(dir)?;
    if points.is_empty() {
        return Err(ValidationError::Row {
            path: dir.display().to_string(),
            line: 0,
            msg: "no GEMM profile rows".into(),
        });
    }
    let (gemm_median_error, gemm_compute_eff, gemm_memory_eff, overlap_exponent) =
        grid_fit(|params| error_stats(gemm_point_checks(&points, params).iter()).0);
    let mut allreduce = Vec::new();
    for (g, file) in [
        ("a100-80gb", "vidur_a100_dgx_allreduce.csv"),
        ("h100-sxm", "vidur_h100_dgx_allreduce.csv"),
    ] {
        let rows = allreduce_rows(&dir.join(file))?;
        let mut fit: Option<(f64, f64, f64)> = None;
        for eff in (3..=10).map(|i| f64::from(i) / 10.0) {
            for lat in (1..=10).map(|i| f64::from(i) * 10.0) {
                let mut gpu = gpu(g);
                gpu.allreduce_eff = eff;
                gpu.allreduce_latency_us = lat;
                let mut errors: Vec<f64> = rows
                    .iter()
                    .map(|&(workers, size, measured)| {
                        let m = nccl_cost(
                            model("llama-2-70b"),
                            gpu.clone(),
                            workers,
                            Dtype::Fp16,
                            Framework::VllmV1,
                            Some(false),
                        );
                        (m.allreduce_s(size) * 1e3 - measured).abs() / measured
                    })
                    .collect();
                let median = median_of(&mut errors);
                if fit.is_none_or(|f| median < f.0 - 1e-12) {
                    fit = Some((median, eff, lat));
                }
            }
        }
        if let Some((median, eff, lat)) = fit {
            allreduce.push((g.to_string(), eff, lat, median));
        }
    }
    let csv = dir.join("calibration.csv");
    let vllm_2023 = if csv.is_file() {
        let rows = splitwise_measurements(&csv)?;
        (!rows.is_empty()).then(|| fit_vllm_2023(&rows, None))
    } else {
        None
    };
    Ok(Fit {
        gemm_compute_eff,
        gemm_memory_eff,
        overlap_exponent,
        gemm_median_error,
        allreduce,
        vllm_2023,
    })
}

/// The GEMM fit held out by GPU: fitted (the same grid as [`calibrate`]) to one GPU's layer
/// profile, its median error on the other GPU's.
#[derive(Debug, Clone, PartialEq)]
pub struct GemmHeldOut {
    /// Catalog GPU the fit saw.
    pub fitted_on: &'static str,
    /// Catalog GPU it is tested on.
    pub tested_on: &'static str,
    /// (compute efficiency, memory efficiency, overlap exponent) of the fit.
    pub fit: (f64, f64, Option<f64>),
    /// Median absolute error on the GPU it saw.
    pub in_sample: f64,
    /// Median absolute error on the other GPU.
    pub held_out: f64,
}

/// [`calibrate`]'s GEMM fit done on each GPU's profile alone and tested on the other's.
pub fn gemm_held_out(dir: &Path) -> Result<Vec<GemmHeldOut>, ValidationError> {
    let points = gemm_profile_points(dir)?;
    let gpus: Vec<&'static str> = {
        let mut g: Vec<&'static str> = points.iter().map(|p| p.1).collect();
        g.dedup();
        g
    };
    let mut out = Vec::new();
    for &fitted_on in &gpus {
        let (seen, rest): (Vec<_>, Vec<_>) = points.iter().partition(|p| p.1 == fitted_on);
        let seen: Vec<_> = seen.into_iter().copied().collect();
        let (in_sample, ec, em, p) =
            grid_fit(|params| error_stats(gemm_point_checks(&seen, params).iter()).0);
        let params = CostParams {
            gemm_compute_eff: ec,
            gemm_memory_eff: em,
            overlap_exponent: p,
            ..CostParams::default()
        };
        for &tested_on in gpus.iter().filter(|&&g| g != fitted_on) {
            let test: Vec<_> = rest
                .iter()
                .filter(|p| p.1 == tested_on)
                .copied()
                .copied()
                .collect();
            out.push(GemmHeldOut {
                fitted_on,
                tested_on,
                fit: (ec, em, p),
                in_sample,
                held_out: error_stats(gemm_point_checks(&test, &params).iter()).0,
            });
        }
    }
    Ok(out)
}

/// Fits the GEMM efficiencies and overlap exponent to measured GEMMs listed in a CSV with
/// the columns `gpu,m,k,n,ms` (a catalog GPU, the GEMM's M x K by K x N shape in 16 bits,
/// and the measured time in ms, each timed alone so the launch cost of eager PyTorch is in
/// it): the same grid as [`calibrate`], without all-reduce figures.
pub fn calibrate_points(path: &Path) -> Result<Fit, ValidationError> {
    let mut points = Vec::new();
    for (line, r) in read_rows(path)? {
        let num = |k: &str| column(&r, k, path, line);
        let name = r.get("gpu").cloned().unwrap_or_default();
        let g = find_gpu(&name).ok_or_else(|| ValidationError::Row {
            path: path.display().to_string(),
            line,
            msg: format!("unknown GPU `{name}` in column `gpu` (see `sim gpus`)"),
        })?;
        let (m, k, n, ms) = (num("m")?, num("k")?, num("n")?, num("ms")?);
        if !(m >= 1.0 && k >= 1.0 && n >= 1.0 && ms > 0.0 && ms.is_finite()) {
            return Err(ValidationError::Row {
                path: path.display().to_string(),
                line,
                msg: format!("m, k, n must be at least 1 and ms positive, got {m}, {k}, {n}, {ms}"),
            });
        }
        points.push((g.clone(), m, k, n, ms));
    }
    if points.is_empty() {
        return Err(ValidationError::Row {
            path: path.display().to_string(),
            line: 1,
            msg: "no measured points (columns gpu,m,k,n,ms)".into(),
        });
    }
    let (gemm_median_error, gemm_compute_eff, gemm_memory_eff, overlap_exponent) =
        grid_fit(|params| {
            let mut errors: Vec<f64> = points
                .iter()
                .map(|(g, m, k, n, ms)| {
                    let model = CostModel::new(
                        Deployment {
                            parallel: Default::default(),
                            model: model("llama-2-7b"),
                            gpu: g.clone(),
                            tp: 1,
                            pp: 1,
                            dtype: Dtype::Bf16,
                            kv_dtype: Dtype::Bf16,
                        },
                        params.clone(),
                    );
                    (model.gemm_s(*m, *k, *n) * 1e3 - ms).abs() / ms
                })
                .collect();
            median_of(&mut errors)
        });
    Ok(Fit {
        gemm_compute_eff,
        gemm_memory_eff,
        overlap_exponent,
        gemm_median_error,
        allreduce: Vec::new(),
        vllm_2023: None,
    })
}

/// The fit as the `[cost]` TOML a scenario takes, with the all-reduce figures for the
/// catalog.
pub fn fit_toml(fit: &Fit, source: &str) -> String {
    let mut s = format!("# Written by `sim calibrate` from {source}.\n[cost]\n");
    let _ = writeln!(s, "gemm_compute_eff = {:.2}", fit.gemm_compute_eff);
    let _ = writeln!(s, "gemm_memory_eff = {:.2}", fit.gemm_memory_eff);
    match fit.overlap_exponent {
        Some(p) => {
            let _ = writeln!(s, "overlap_exponent = {p:.1}");
        }
        None => {
            // The plain maximum fits best.
            let _ = writeln!(s, "overlap_exponent = inf");
        }
    }
    let _ = writeln!(
        s,
        "# GEMMs: median absolute error {:.1}%",
        100.0 * fit.gemm_median_error
    );
    for (g, eff, lat, err) in &fit.allreduce {
        let _ = writeln!(
            s,
            "# {g}: allreduce_eff = {eff:.1}, allreduce_latency_us = {lat:.0} (NCCL profile median error {:.1}%)",
            100.0 * err
        );
    }
    if let Some(f) = &fit.vllm_2023 {
        let _ = writeln!(
            s,
            "# framework vllm-2023: step_overhead_us = {:.0}, per_seq_overhead_us = {:.0}, prefill attention scale {:.2} (Splitwise rows: max error {:.1}%, median {:.1}%)",
            f.step_overhead_us,
            f.per_seq_overhead_us,
            f.prefill_attention_scale,
            100.0 * f.max_error,
            100.0 * f.median_error
        );
    }
    s
}
