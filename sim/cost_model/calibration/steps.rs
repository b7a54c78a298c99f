//! The cost model fitted to whole steps measured on a real runtime: `sim calibrate --backend
//! cuda --model SHAPE` times forward steps of the CUDA runtime (synthetic weights of the
//! shape) over a grid of decode batches and contexts and prefill lengths
//! ([`kernels::cuda::check::measure_step_grid`]); [`fit_steps`] fits the GEMM and attention
//! efficiencies and the per-step overhead to them, and [`fit_toml`] writes the calibration
//! file (device and date included) that `sim run --calibration` and a scenario's
//! `cost.calibration` read. `--steps FILE` refits recorded measurements ([`read_steps`]).

use std::fmt::Write as _;
use std::path::Path;

use kernels::cuda::check::StepTime;

use crate::cost_model::measurements::median_of;
use crate::cost_model::{CostModel, CostParams, Deployment};

/// A measured step as the cost model sees it.
fn predict(m: &CostModel, p: &StepTime) -> f64 {
    let c = if p.tokens > 0 {
        m.step_cost(std::iter::once((0, p.tokens)), std::iter::empty(), 1, 1)
    } else {
        m.step_cost(
            std::iter::empty(),
            std::iter::repeat_n((p.ctx, 1), p.batch as usize),
            p.batch,
            p.batch,
        )
    };
    c.seconds * 1e3
}

/// The fit of [`fit_steps`].
#[derive(Debug, Clone, PartialEq)]
pub struct StepFit {
    /// The fitted parameters (the others are the defaults).
    pub params: CostParams,
    /// Median absolute relative error over the steps.
    pub median_error: f64,
    /// Largest.
    pub max_error: f64,
    /// Per step: measured and predicted ms.
    pub points: Vec<(StepTime, f64)>,
}

/// Whether the CUDA runtime runs a measured step outside its CUDA graphs: a prefill, or a
/// decode of more sequences (tokens and draws) than its graphs hold.
fn eager(p: &StepTime) -> bool {
    p.tokens > 0 || p.batch as usize > kernels::cuda::GRAPH_MAX_TOKENS
}

/// Fits `gemm_compute_eff`, `gemm_memory_eff`, `attn_memory_eff`, `attn_compute_eff`, the
/// per-step overhead, the cost per kernel (`kernel_launch_us`: the gap a small kernel
/// leaves even in a CUDA graph) and the host's floor under a step run outside the graphs
/// (`eager_layer_us`, with `graph_max_tokens` the runtime's graph size) to measured steps
/// of `d`'s model, by exhaustive search over fixed grids (reproducible), minimising the
/// median absolute relative error and then the largest. The attention's compute
/// efficiency is what long prefills need: a runtime whose prefill attention runs off the
/// tensor cores spends a quadratic term the GEMMs' rate cannot absorb (the H200's
/// 4,096-token prefill took 161 ms, 2.4x its 2,048-token one). The eager floor is what a
/// small model's steps need: SmolLM2-135M's decode of 16 sequences took 1.7 ms on the H100
/// against 1.1 ms for 8 in a graph, the host launching its 30 layers one by one.
pub fn fit_steps(d: &Deployment, block_size: u32, points: &[StepTime]) -> Option<StepFit> {
    if points.is_empty() {
        return None;
    }
    let overheads = [
        0.0, 10.0, 20.0, 40.0, 70.0, 100.0, 150.0, 200.0, 300.0, 500.0, 700.0, 1000.0, 1500.0,
    ];
    // Per kernel, microseconds: what a small model's steps show (SmolLM2-135M's batch-1
    // decode took 0.93 ms on the H200, about 0.1 ms of it reading weights and KV).
    let launch_costs = [0.0, 1.0, 2.0, 3.0, 4.0, 6.0];
    // Kernels per step: the launch term is additive per kernel, so one difference gives
    // each step's count whatever the efficiencies.
    let kernels: Vec<f64> = {
        let with = |us: f64| {
            CostModel::new(
                d.clone(),
                CostParams {
                    kernel_launch_us: Some(us),
                    ..CostParams::default()
                },
            )
            .with_block_size(block_size)
        };
        let (one, zero) = (with(1.0), with(0.0));
        points
            .iter()
            .map(|p| (predict(&one, p) - predict(&zero, p)) * 1e3)
            .collect()
    };
    // Prefill attention's fraction of the 16-bit peak: from scalar kernels (a few percent)
    // to FlashAttention-class ones.
    let attn_compute = [0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.75];
    // The host's time per layer of an eager step, microseconds (0 first: a tie keeps the
    // floor out), and each step's floor per microsecond.
    let eager_us = [0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 100.0];
    let floors: Vec<f64> = points
        .iter()
        .map(|p| {
            if eager(p) {
                f64::from(d.model.layers) * 1e-3
            } else {
                0.0
            }
        })
        .collect();
    let mut best: Option<(f64, f64, CostParams)> = None;
    // Each candidate's GPU times and errors, reused.
    let (mut gpu, mut errs) = (vec![0.0; points.len()], vec![0.0; points.len()]);
    for ec in (6..=19).map(|i| f64::from(i) / 20.0) {
        for em in (12..=19).map(|i| f64::from(i) / 20.0) {
            for (ea, eac) in (10..=19)
                .map(|i| f64::from(i) / 20.0)
                .flat_map(|ea| attn_compute.iter().map(move |&eac| (ea, eac)))
            {
                let base_params = CostParams {
                    gemm_compute_eff: ec,
                    gemm_memory_eff: em,
                    attn_memory_eff: ea,
                    attn_compute_eff: eac,
                    prefill_attention_scale: Some(1.0),
                    step_overhead_us: Some(0.0),
                    per_seq_overhead_us: Some(0.0),
                    kernel_launch_us: Some(0.0),
                    ..CostParams::default()
                };
                let m = CostModel::new(d.clone(), base_params.clone()).with_block_size(block_size);
                let base: Vec<f64> = points.iter().map(|p| predict(&m, p)).collect();
                for (&o, &l) in overheads
                    .iter()
                    .flat_map(|o| launch_costs.iter().map(move |l| (o, l)))
                {
                    for (g, (b, k)) in gpu.iter_mut().zip(base.iter().zip(&kernels)) {
                        *g = b + l * k * 1e-3;
                    }
                    for &e in &eager_us {
                        // A floor under no step's GPU time is the fit without it.
                        if e > 0.0 && gpu.iter().zip(&floors).all(|(g, f)| e * f <= *g) {
                            continue;
                        }
                        for (((x, p), g), f) in errs.iter_mut().zip(points).zip(&gpu).zip(&floors) {
                            *x = (o * 1e-3 + g.max(e * f) - p.ms).abs() / p.ms;
                        }
                        let max = errs.iter().copied().fold(0.0, f64::max);
                        let median = median_of(&mut errs);
                        let better = best.as_ref().is_none_or(|(bm, bx, _)| {
                            median < bm - 1e-12 || (median <= bm + 1e-12 && max < bx - 1e-12)
                        });
                        if better {
                            let params = CostParams {
                                step_overhead_us: Some(o),
                                kernel_launch_us: Some(l),
                                eager_layer_us: (e > 0.0).then_some(e),
                                graph_max_tokens: (e > 0.0)
                                    .then_some(kernels::cuda::GRAPH_MAX_TOKENS as u32),
                                ..base_params.clone()
                            };
                            best = Some((median, max, params));
                        }
                    }
                }
            }
        }
    }
    let (median_error, max_error, params) = best?;
    let m = CostModel::new(d.clone(), params.clone()).with_block_size(block_size);
    let points = points.iter().map(|p| (*p, predict(&m, p))).collect();
    Some(StepFit {
        params,
        median_error,
        max_error,
        points,
    })
}

/// The calibration file of a fit: the `[cost]` keys, and in comments the device, the
/// date, the model and every step with its error.
pub fn fit_toml(fit: &StepFit, how: &str, device: &str, date: &str, model: &str) -> String {
    let p = &fit.params;
    let mut s = format!(
        "# Written by `sim calibrate {how}`, {date}: whole forward steps of {model} (synthetic\n\
         # weights) on the CUDA runtime on {device}, {} steps; the fit's median error\n\
         # {:.1}%, largest {:.1}%.\n[cost]\n",
        fit.points.len(),
        100.0 * fit.median_error,
        100.0 * fit.max_error
    );
    let _ = writeln!(s, "gemm_compute_eff = {:.2}", p.gemm_compute_eff);
    let _ = writeln!(s, "gemm_memory_eff = {:.2}", p.gemm_memory_eff);
    let _ = writeln!(s, "attn_memory_eff = {:.2}", p.attn_memory_eff);
    let _ = writeln!(s, "attn_compute_eff = {:.2}", p.attn_compute_eff);
    s.push_str("prefill_attention_scale = 1\n");
    let _ = writeln!(
        s,
        "step_overhead_us = {:.0}",
        p.step_overhead_us.unwrap_or(0.0)
    );
    let _ = writeln!(
        s,
        "kernel_launch_us = {:.0}",
        p.kernel_launch_us.unwrap_or(0.0)
    );
    s.push_str("per_seq_overhead_us = 0\n");
    if let (Some(us), Some(g)) = (p.eager_layer_us, p.graph_max_tokens) {
        let _ = writeln!(s, "eager_layer_us = {us:.0}\ngraph_max_tokens = {g}");
    }
    s.push_str("# step (batch x ctx, or prefill tokens): measured ms, fitted ms\n");
    for (t, pred) in &fit.points {
        let what = if t.tokens > 0 {
            format!("prefill {}", t.tokens)
        } else {
            format!("decode {} x {}", t.batch, t.ctx)
        };
        let _ = writeln!(
            s,
            "#   {what}: {:.3}, {:.3} ({:+.1}%)",
            t.ms,
            pred,
            100.0 * (pred - t.ms) / t.ms
        );
    }
    s
}

/// Reads step measurements (`batch,ctx,tokens,ms`), e.g. those `sim calibrate --backend
/// cuda` writes beside its calibration file, to fit again without a GPU.
pub fn read_steps(path: &Path) -> Result<Vec<StepTime>, String> {
    let shown = path.display();
    let mut r = csv::Reader::from_path(path).map_err(|e| format!("{shown}: {e}"))?;
    let mut out = Vec::new();
    for (i, rec) in r.records().enumerate() {
        let rec = rec.map_err(|e| format!("{shown}: {e}"))?;
        let count = |j: usize, what: &str, max: u32| -> Result<u32, String> {
            rec.get(j)
                .unwrap_or("")
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|&v| v <= max)
                .ok_or_else(|| {
                    format!(
                        "{shown}: line {}: `{what}` is not a whole number up to {max}",
                        i + 2
                    )
                })
        };
        let ms = rec
            .get(3)
            .unwrap_or("")
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .ok_or_else(|| format!("{shown}: line {}: `ms` is not a finite number", i + 2))?;
        let t = StepTime {
            batch: count(0, "batch", 65_536)?,
            ctx: count(1, "ctx", 1 << 24)?,
            tokens: count(2, "tokens", 1 << 24)?,
            ms,
        };
        if t.ms <= 0.0 || (t.tokens == 0 && (t.batch == 0 || t.ctx == 0)) {
            return Err(format!(
                "{shown}: line {}: a step needs ms > 0 and either tokens or batch and ctx",
                i + 2
            ));
        }
        out.push(t);
    }
    Ok(out)
}

/// Writes step measurements as [`read_steps`] reads them.
pub fn steps_csv(points: &[StepTime]) -> String {
    let mut s = String::from("batch,ctx,tokens,ms\n");
    for p in points {
        let _ = writeln!(s, "{},{},{},{:.4}", p.batch, p.ctx, p.tokens, p.ms);
    }
    s
}

/// Today's date (UTC), `YYYY-MM-DD`.
pub fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    chrono::DateTime::from_timestamp(secs, 0)
        .map(|d| d.format("%Y-%m-%d").to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{find_gpu, find_model, Dtype};

    /// Whole steps of Llama-3-8B (synthetic bf16 weights, 16-token blocks) measured on a
    /// lent H100 SXM in session 12 (BENCHMARKS.md, `sim cuda-bench`, CUDA events, median of
    /// 20; the runtime's defaults: the batch-1 GEMM path, graphs up to 8 tokens).
    const H100_STEPS: &str = "batch,ctx,tokens,ms
1,512,0,6.803
1,2048,0,6.854
2,2048,0,7.728
4,2048,0,7.962
8,2048,0,8.673
64,1024,0,12.001
1,0,2048,68.03
";

    /// Llama-3-8B in bf16 on one GPU of the catalog.
    fn llama_3_8b_on(gpu: &str) -> Deployment {
        Deployment {
            parallel: Default::default(),
            model: find_model("llama-3-8b").expect("model").clone(),
            gpu: find_gpu(gpu).expect("gpu").clone(),
            tp: 1,
            pp: 1,
            dtype: Dtype::Bf16,
            kv_dtype: Dtype::Bf16,
        }
    }

    #[test]
    fn the_fit_reproduces_recorded_h100_steps() {
        let dir = std::env::temp_dir().join(format!("sim-fit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("steps.csv");
        std::fs::write(&path, H100_STEPS).expect("write");
        let points = read_steps(&path).expect("read");
        assert_eq!(steps_csv(&points).lines().count(), 8);
        let d = llama_3_8b_on("h100-sxm");
        let fit = fit_steps(&d, 16, &points).expect("fit");
        // Seven steps from batch-1 decode (weight-bound) to a 2048-token prefill
        // (compute-bound) within a few percent with four parameters.
        assert!(fit.median_error < 0.05, "{fit:?}");
        assert!(fit.max_error < 0.15, "{fit:?}");
        // Physically sensible: weight streaming at 60-95% of HBM, GEMMs at 30-95% of peak.
        assert!(
            (0.6..=0.95).contains(&fit.params.gemm_memory_eff),
            "{fit:?}"
        );
        assert!(
            (0.3..=0.95).contains(&fit.params.gemm_compute_eff),
            "{fit:?}"
        );
        let toml = fit_toml(
            &fit,
            "--backend cuda",
            "NVIDIA H100 80GB HBM3",
            "2026-11-23",
            "llama-3-8b",
        );
        let parsed: toml::Table = toml::from_str(&toml).expect("valid TOML");
        let cost = parsed["cost"].as_table().expect("[cost]");
        assert!(cost.contains_key("gemm_memory_eff") && cost.contains_key("step_overhead_us"));
        // Deterministic.
        assert_eq!(fit_steps(&d, 16, &points), Some(fit));
        std::fs::write(&path, "batch,ctx,tokens,ms\n1,0,0,3\n").expect("write");
        assert!(read_steps(&path).unwrap_err().contains("line 2"));
    }

    /// The full grid measured on the lent H200 (21 steps, shipped): the prefills of 128 to
    /// 4,096 tokens are only fitted with the attention's own compute efficiency, since
    /// this runtime's prefill attention does not run on the tensor cores (the 4,096-token
    /// prefill was 36% over the fit without it).
    #[test]
    fn the_fit_covers_the_h200_grid_prefills_included() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("calibration/h200-cuda.steps.csv");
        let points = read_steps(&path).expect("shipped steps");
        assert_eq!(points.len(), 21);
        let d = llama_3_8b_on("h200");
        let fit = fit_steps(&d, 16, &points).expect("fit");
        assert!(fit.median_error < 0.03, "{fit:?}");
        assert!(fit.max_error < 0.12, "{fit:?}");
        for (t, pred) in fit.points.iter().filter(|(t, _)| t.tokens > 0) {
            assert!(
                (pred - t.ms).abs() / t.ms < 0.12,
                "prefill {}: {pred} vs {}",
                t.tokens,
                t.ms
            );
        }
        assert!(fit.params.attn_compute_eff < 0.2, "{fit:?}");
        // An 8B model's eager steps compute longer than the host launches: no floor.
        assert_eq!(fit.params.eager_layer_us, None, "{fit:?}");
    }

    /// SmolLM2-135M's grid on the lent H100 (shipped): its decodes of 16 sequences and more
    /// run outside the runtime's CUDA graphs and take 1.7-2.2 ms however little they
    /// compute, against 0.95-1.2 ms for up to 8 in a graph. Only the host's floor under the
    /// eager steps fits both sides.
    #[test]
    fn a_small_models_eager_steps_fit_the_hosts_floor() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("calibration/h100-smollm2-cuda.steps.csv");
        let points = read_steps(&path).expect("shipped steps");
        let d = Deployment {
            model: find_model("smollm2-135m").expect("model").clone(),
            ..llama_3_8b_on("h100-sxm")
        };
        let fit = fit_steps(&d, 16, &points).expect("fit");
        let us = fit.params.eager_layer_us.expect("an eager floor");
        assert!((20.0..=80.0).contains(&us), "{fit:?}");
        assert_eq!(
            fit.params.graph_max_tokens,
            Some(kernels::cuda::GRAPH_MAX_TOKENS as u32)
        );
        assert!(fit.median_error < 0.03, "{fit:?}");
        for (t, pred) in &fit.points {
            if t.tokens == 0 && (16..=32).contains(&t.batch) {
                assert!((pred - t.ms).abs() / t.ms < 0.05, "{t:?}: {pred}");
            }
        }
        let toml = fit_toml(&fit, "--steps", "h100-sxm", "2026-11-27", "smollm2-135m");
        let parsed: toml::Table = toml::from_str(&toml).expect("valid TOML");
        let cost: CostParams = parsed["cost"].clone().try_into().expect("cost keys");
        assert_eq!(cost.eager_layer_us, Some(us));
        assert_eq!(cost.graph_max_tokens, fit.params.graph_max_tokens);
    }
}
