//! A hardware profile and cost parameters fitted to a run `sim serve` served on a real
//! runtime (`sim calibrate --observed SERVED_RUN`): the loop that makes the cost model
//! predict this machine without a GPU (the CPU runtime on a laptop or a CI box).
//!
//! In: the run's `steps.csv` (every step's measured duration, its prefill and decode
//! tokens, its sequences and the KV tokens they hold) and the model it served. Out: the
//! machine as a hardware file (`hardware.gpu_file`: the FLOP/s and bytes/s the runtime
//! reached, which are what the cost model's peaks stand for) and a `[cost]` table (the
//! attention's bandwidth relative to the weights', the per-step and per-sequence
//! overheads), with the fit's error on the steps. The search is exhaustive over fixed grids
//! around first estimates (the largest prefills' FLOP/s, the smallest decodes' bytes/s), so
//! the same run gives the same files.

use std::fmt::Write as _;
use std::path::Path;

use super::super::{CostModel, CostParams, Deployment};
use crate::catalog::{Dtype, Gpu, ModelSpec};

/// One measured step, as the cost model prices it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ServedStep {
    /// Prefill tokens (taken as one chunk from position 0).
    pub prefill: u32,
    /// Decoding sequences.
    pub decodes: u32,
    /// Their mean context.
    pub decode_ctx: u32,
    /// Sequences in the step.
    pub seqs: u32,
    /// Measured duration, ms.
    pub ms: f64,
}

/// Most tokens or sequences a step of a served run may record.
const MAX_STEP_TOKENS: u32 = 1 << 20;

/// Reads a served run's `steps.csv` (steps without work or duration are skipped).
pub fn read_steps(path: &Path) -> Result<Vec<ServedStep>, String> {
    let shown = path.display();
    let mut r = csv::Reader::from_path(path).map_err(|e| format!("{shown}: {e}"))?;
    let header = r.headers().map_err(|e| format!("{shown}: {e}"))?.clone();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| format!("{shown}: line 1: column `{name}` not found"))
    };
    let (dur, seqs, pre, dec, kv) = (
        col("duration_ms")?,
        col("num_seqs")?,
        col("num_prefill_tokens")?,
        col("num_decode_tokens")?,
        col("kv_tokens")?,
    );
    let mut out = Vec::new();
    for (i, rec) in r.records().enumerate() {
        let rec = rec.map_err(|e| format!("{shown}: {e}"))?;
        let num = |c: usize, name: &str| -> Result<f64, String> {
            rec.get(c)
                .unwrap_or("")
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| format!("{shown}: line {}: `{name}` is not a number >= 0", i + 2))
        };
        let (ms, p, d) = (
            num(dur, "duration_ms")?,
            num(pre, "num_prefill_tokens")?,
            num(dec, "num_decode_tokens")?,
        );
        if ms <= 0.0 || p + d == 0.0 {
            continue;
        }
        // Counts beyond any engine's step (a hostile file) would price for ever.
        let seqs_n = num(seqs, "num_seqs")?;
        for (v, name) in [
            (p, "num_prefill_tokens"),
            (d, "num_decode_tokens"),
            (seqs_n, "num_seqs"),
        ] {
            if v > f64::from(MAX_STEP_TOKENS) {
                return Err(format!(
                    "{shown}: line {}: `{name}` {v} is more than a step holds ({MAX_STEP_TOKENS})",
                    i + 2
                ));
            }
        }
        let kv_tokens = num(kv, "kv_tokens")?;
        let held = (kv_tokens - p).max(d);
        out.push(ServedStep {
            prefill: p as u32,
            decodes: d as u32,
            decode_ctx: if d > 0.0 {
                (held / d).round() as u32
            } else {
                0
            },
            seqs: seqs_n as u32,
            ms,
        });
    }
    Ok(out)
}

/// The fit of [`fit`].
#[derive(Debug, Clone, PartialEq)]
pub struct ServedFit {
    /// FLOP/s the runtime reached (the profile's 16-bit and fp32 peaks).
    pub flops: f64,
    /// The profile's bandwidth (bytes/s): the faster of the weights' and the attention's
    /// streams, each an efficiency of it.
    pub bytes_per_s: f64,
    /// The `[cost]` parameters (attention bandwidth and overheads fitted).
    pub params: CostParams,
    /// Median absolute relative error: the mean of the steps that prefill's and the steps
    /// that only decode's.
    pub median_error: f64,
    /// Its 90th percentile.
    pub p90_error: f64,
    /// Steps fitted.
    pub steps: usize,
}

/// A machine with `flops` and `bw` as its peaks (fp8 and fp4 run at the 16-bit rate).
fn machine(flops: f64, bw: f64, mem_bytes: f64) -> Gpu {
    Gpu {
        name: "served",
        display: "served",
        mem_bytes,
        flops_16: flops,
        flops_fp8: None,
        flops_fp4: None,
        flops_32: flops,
        mem_bw: bw,
        link_bw: bw,
        pcie_bw: bw,
        nvlink_domain: 1,
        network_bw: bw,
        allreduce_eff: 1.0,
        allreduce_latency_us: 0.0,
        price_per_hour: 0.0,
    }
}

fn predict_ms(m: &CostModel, s: &ServedStep) -> f64 {
    let prefill = (s.prefill > 0).then_some((0, s.prefill));
    let decodes = std::iter::repeat_n((s.decode_ctx.max(1), 1), s.decodes as usize);
    let samples = s.decodes + u32::from(s.prefill > 0);
    m.step_cost(prefill.into_iter(), decodes, samples, s.seqs.max(1))
        .seconds
        * 1e3
}

/// A fit's score and setting: (median error, 90th percentile, FLOP/s, weights' bytes/s,
/// attention's relative bandwidth, step overhead us, per-sequence overhead us).
type Best = (f64, f64, f64, f64, f64, f64, f64);

/// The `q` quantile of `v` (reordered in place; 0 when empty).
fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let k = ((v.len() - 1) as f64 * q).round() as usize;
    *v.select_nth_unstable_by(k, f64::total_cmp).1
}

/// Median of `v` (sorted in place).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return 0.0;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// Most steps the search prices (evenly spaced over the run): enough for a stable median.
const MAX_STEPS: usize = 600;

/// Fits the machine's FLOP/s and bandwidth, the attention's relative bandwidth and the
/// per-step and per-sequence overheads to `steps` of `model` (weights in `dtype`, blocks of
/// `block_size`). `None` without steps.
pub fn fit(
    model: &ModelSpec,
    dtype: Dtype,
    block_size: u32,
    steps: &[ServedStep],
) -> Option<ServedFit> {
    if steps.is_empty() {
        return None;
    }
    let stride = steps.len().div_ceil(MAX_STEPS);
    let pts: Vec<ServedStep> = steps.iter().step_by(stride).copied().collect();
    let deployment = |flops: f64, bw: f64| Deployment {
        parallel: Default::default(),
        model: model.clone(),
        gpu: machine(flops, bw, 64.0 * (1u64 << 30) as f64),
        tp: 1,
        pp: 1,
        dtype,
        kv_dtype: Dtype::Bf16,
    };
    // First estimates: the big prefills are compute-bound, the lone decodes memory-bound.
    let flops_per_token = 2.0 * model.params();
    let weight_bytes = model.params() * dtype.bytes();
    let mut f0: Vec<f64> = pts
        .iter()
        .filter(|s| s.prefill >= 64)
        .map(|s| flops_per_token * f64::from(s.prefill) / (s.ms * 1e-3))
        .collect();
    let mut b0: Vec<f64> = pts
        .iter()
        .filter(|s| s.prefill == 0 && s.decodes <= 2)
        .map(|s| weight_bytes / (s.ms * 1e-3))
        .collect();
    let mut b0 = median(&mut b0);
    if b0 <= 0.0 {
        let mut all: Vec<f64> = pts.iter().map(|s| weight_bytes / (s.ms * 1e-3)).collect();
        b0 = median(&mut all);
    }
    let mut f0 = median(&mut f0);
    if f0 <= 0.0 {
        f0 = 10.0 * b0;
    }
    let overheads_us = [
        0.0, 50.0, 100.0, 200.0, 300.0, 500.0, 750.0, 1000.0, 1500.0, 2000.0, 3000.0,
    ];
    let per_seq_us = [
        0.0, 50.0, 100.0, 200.0, 400.0, 700.0, 1000.0, 1500.0, 2000.0, 3000.0, 4000.0, 6000.0,
    ];
    // Attention's bandwidth relative to the weights' (the CPU runtime's f32 KV against
    // its quantized weights): the peak is the faster, each an efficiency of it.
    let attn: [f64; 7] = [0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0];
    let base = CostParams {
        gemm_compute_eff: 1.0,
        gemm_memory_eff: 1.0,
        attn_compute_eff: 1.0,
        elementwise_memory_eff: 1.0,
        kernel_launch_us: Some(0.0),
        step_overhead_us: Some(0.0),
        per_seq_overhead_us: Some(0.0),
        request_overhead_ms: Some(0.0),
        ..CostParams::default()
    };
    let has_prefill = pts.iter().any(|s| s.prefill > 0);
    let has_decode = pts.iter().any(|s| s.prefill == 0);
    let groups = f64::from(u8::from(has_prefill) + u8::from(has_decode));
    let mut errs = Vec::with_capacity(pts.len());
    // Scores every setting of the grids; the best (median, p90) and its setting.
    let mut search =
        |flops: &[f64], bws: &[f64], attn: &[f64], steps_us: &[f64], seqs_us: &[f64]| {
            let mut best: Option<Best> = None;
            for &f in flops {
                for &bw in bws {
                    for &a in attn {
                        let peak = bw * a.max(1.0);
                        let params = CostParams {
                            gemm_memory_eff: bw / peak,
                            elementwise_memory_eff: bw / peak,
                            attn_memory_eff: bw * a / peak,
                            ..base.clone()
                        };
                        let m =
                            CostModel::new(deployment(f, peak), params).with_block_size(block_size);
                        let raw: Vec<f64> = pts.iter().map(|s| predict_ms(&m, s)).collect();
                        for &o in steps_us {
                            for &q in seqs_us {
                                let err = |s: &ServedStep, r: f64| {
                                    let p = r + (o + q * f64::from(s.seqs)) * 1e-3;
                                    (p - s.ms).abs() / s.ms
                                };
                                // Steps that prefill and steps that only decode weigh the same
                                // (a run's steps are mostly decodes; its TTFT is the prefills').
                                let mut med = 0.0;
                                for prefills in [false, true] {
                                    errs.clear();
                                    errs.extend(
                                        pts.iter()
                                            .zip(&raw)
                                            .filter(|(s, _)| (s.prefill > 0) == prefills)
                                            .map(|(s, &r)| err(s, r)),
                                    );
                                    // The typical step's error, plus the bias of the
                                    // group's total time (what latencies add up).
                                    let (mut sum_p, mut sum_m) = (0.0, 0.0);
                                    for (s, &r) in pts
                                        .iter()
                                        .zip(&raw)
                                        .filter(|(s, _)| (s.prefill > 0) == prefills)
                                    {
                                        sum_p += r + (o + q * f64::from(s.seqs)) * 1e-3;
                                        sum_m += s.ms;
                                    }
                                    let bias = if sum_m > 0.0 {
                                        (sum_p - sum_m).abs() / sum_m
                                    } else {
                                        0.0
                                    };
                                    med += (quantile(&mut errs, 0.5) + bias) / groups;
                                }
                                errs.clear();
                                errs.extend(pts.iter().zip(&raw).map(|(s, &r)| err(s, r)));
                                let p90 = quantile(&mut errs, 0.9);
                                if best.is_none_or(|b| (med, p90) < (b.0, b.1)) {
                                    best = Some((med, p90, f, bw, a, o, q));
                                }
                            }
                        }
                    }
                }
            }
            best
        };
    // Coarse: factors of 2^(1/4) around the first estimates; then fine: 2^(1/16) around
    // the coarse best, the overheads in steps of 100 us.
    let around = |x: f64, step: f64, n: i32| -> Vec<f64> {
        (-n..=n)
            .map(|k| x * 2f64.powf(f64::from(k) * step))
            .collect()
    };
    let coarse = search(
        &around(f0, 0.25, 8),
        &around(b0, 0.25, 8),
        &attn,
        &overheads_us,
        &per_seq_us,
    )?;
    let fine_us = |x: f64| -> Vec<f64> {
        (-8..=8)
            .map(|k| x + f64::from(k) * 100.0)
            .filter(|&v| v >= 0.0)
            .collect()
    };
    let best = search(
        &around(coarse.2, 1.0 / 16.0, 4),
        &around(coarse.3, 1.0 / 16.0, 4),
        &[coarse.4],
        &fine_us(coarse.5),
        &fine_us(coarse.6),
    )
    .filter(|b| (b.0, b.1) <= (coarse.0, coarse.1))
    .or(Some(coarse));
    let (median_error, p90_error, flops, bw, a, o, q) = best?;
    let peak = bw * a.max(1.0);
    Some(ServedFit {
        flops,
        bytes_per_s: peak,
        params: CostParams {
            gemm_memory_eff: bw / peak,
            elementwise_memory_eff: bw / peak,
            attn_memory_eff: bw * a / peak,
            step_overhead_us: Some(o),
            per_seq_overhead_us: Some(q),
            ..base
        },
        median_error,
        p90_error,
        steps: pts.len(),
    })
}

/// The hardware file of a fit (`hardware.gpu_file`), named `name`, with `memory_gib` of
/// memory (the host memory the runtime may use).
pub fn hardware_toml(
    fit: &ServedFit,
    name: &str,
    source: &str,
    date: &str,
    memory_gib: f64,
) -> String {
    let tflops = fit.flops / 1e12;
    let gbs = fit.bytes_per_s / 1e9;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Written by `sim calibrate --observed {source}`, {date}: the FLOP/s and bytes/s the\n\
         # runtime reached on this machine, fitted to {} served steps (median error {:.1}%,\n\
         # 90th percentile {:.1}%). Use with the [cost] file written beside it.",
        fit.steps,
        100.0 * fit.median_error,
        100.0 * fit.p90_error
    );
    let _ = writeln!(s, "name = {name:?}");
    let _ = writeln!(
        s,
        "display = {:?}",
        format!("the machine that served {source}")
    );
    let _ = writeln!(s, "memory_gib = {memory_gib}");
    let _ = writeln!(s, "bf16_tflops = {tflops:.6}");
    let _ = writeln!(s, "fp32_tflops = {tflops:.6}");
    let _ = writeln!(s, "memory_bandwidth_gbs = {gbs:.3}");
    let _ = writeln!(s, "interconnect_gbs = {gbs:.3}");
    let _ = writeln!(s, "pcie_gbs = {gbs:.3}");
    let _ = writeln!(s, "nvlink_domain = 1");
    s
}

/// The `[cost]` file of a fit.
pub fn cost_toml(fit: &ServedFit, source: &str, date: &str) -> String {
    let p = &fit.params;
    let mut s = format!(
        "# Written by `sim calibrate --observed {source}`, {date}: the cost model of the machine\n\
         # in the hardware file beside this one (its peaks are what the runtime reached: compute\n\
         # at efficiency 1, the weights' and attention's streams as fractions of the bandwidth),\n\
         # fitted to {} served steps: median error {:.1}%.\n[cost]\n",
        fit.steps,
        100.0 * fit.median_error
    );
    let _ = writeln!(s, "gemm_compute_eff = 1.0\nattn_compute_eff = 1.0");
    let _ = writeln!(s, "gemm_memory_eff = {}", p.gemm_memory_eff);
    let _ = writeln!(s, "elementwise_memory_eff = {}", p.elementwise_memory_eff);
    let _ = writeln!(s, "attn_memory_eff = {}", p.attn_memory_eff);
    let _ = writeln!(s, "kernel_launch_us = 0.0");
    let _ = writeln!(
        s,
        "step_overhead_us = {}",
        p.step_overhead_us.unwrap_or(0.0)
    );
    let _ = writeln!(
        s,
        "per_seq_overhead_us = {}",
        p.per_seq_overhead_us.unwrap_or(0.0)
    );
    // The served records' arrival is the server's own receipt: no front end before it.
    let _ = writeln!(s, "request_overhead_ms = 0.0");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Steps priced by a known machine and overheads (a spread of decode batches and
    /// prefill chunks, with 3% of noise) are fitted back within the noise, and the fit's
    /// profile prices new steps as the machine does.
    #[test]
    fn a_known_machine_is_recovered_from_its_steps() {
        let model = crate::catalog::find_model("smollm2-135m").expect("catalog model");
        let (flops, bw, step_us, seq_us) = (150e9, 30e9, 800.0, 400.0);
        let truth = CostModel::new(
            Deployment {
                parallel: Default::default(),
                model: model.clone(),
                gpu: machine(flops, bw, 64e9),
                tp: 1,
                pp: 1,
                dtype: Dtype::Bf16,
                kv_dtype: Dtype::Bf16,
            },
            CostParams {
                gemm_compute_eff: 1.0,
                gemm_memory_eff: 1.0,
                attn_compute_eff: 1.0,
                elementwise_memory_eff: 1.0,
                attn_memory_eff: 0.5,
                kernel_launch_us: Some(0.0),
                step_overhead_us: Some(step_us),
                per_seq_overhead_us: Some(seq_us),
                ..CostParams::default()
            },
        )
        .with_block_size(16);
        let mut steps = Vec::new();
        let mut noise = 0u64;
        for batch in 1..=16u32 {
            for (prefill, ctx) in [(0, 150), (0, 400), (128, 150), (512, 300)] {
                let mut s = ServedStep {
                    prefill,
                    decodes: batch,
                    decode_ctx: ctx,
                    seqs: batch + u32::from(prefill > 0),
                    ms: 0.0,
                };
                noise = noise
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let jitter = 1.0 + 0.03 * ((noise >> 33) as f64 / f64::from(u32::MAX) - 0.5);
                s.ms = predict_ms(&truth, &s) * jitter;
                steps.push(s);
            }
        }
        let fit = fit(model, Dtype::Bf16, 16, &steps).expect("a fit");
        assert!(fit.median_error < 0.03, "median error {}", fit.median_error);
        assert!(fit.p90_error < 0.06, "p90 error {}", fit.p90_error);
        // New steps (a batch of 24 and a 1,024-token prefill) priced within 10%.
        let fitted = CostModel::new(
            Deployment {
                parallel: Default::default(),
                model: model.clone(),
                gpu: machine(fit.flops, fit.bytes_per_s, 64e9),
                tp: 1,
                pp: 1,
                dtype: Dtype::Bf16,
                kv_dtype: Dtype::Bf16,
            },
            fit.params.clone(),
        )
        .with_block_size(16);
        for s in [
            ServedStep {
                prefill: 0,
                decodes: 24,
                decode_ctx: 200,
                seqs: 24,
                ms: 0.0,
            },
            ServedStep {
                prefill: 1024,
                decodes: 4,
                decode_ctx: 200,
                seqs: 5,
                ms: 0.0,
            },
        ] {
            let (t, f) = (predict_ms(&truth, &s), predict_ms(&fitted, &s));
            assert!(
                (f - t).abs() / t < 0.10,
                "{s:?}: truth {t:.2} ms, fit {f:.2} ms"
            );
        }
    }

    #[test]
    fn steps_csv_rows_without_work_are_skipped_and_bad_ones_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("steps.csv");
        std::fs::write(
            &p,
            "step,duration_ms,num_seqs,num_prefill_tokens,num_decode_tokens,kv_tokens\n\
             0,5.0,1,100,0,100\n1,0,0,0,0,0\n2,3.0,2,0,2,204\n",
        )
        .expect("write");
        let s = read_steps(&p).expect("reads");
        assert_eq!(s.len(), 2);
        assert_eq!((s[1].decodes, s[1].decode_ctx), (2, 102));
        std::fs::write(
            &p,
            "step,duration_ms,num_seqs,num_prefill_tokens,num_decode_tokens,kv_tokens\n0,x,1,1,0,1\n",
        )
        .expect("write");
        let e = read_steps(&p).unwrap_err();
        assert!(e.contains("line 2") && e.contains("duration_ms"), "{e}");
    }
}
