//! The fp8 GEMM efficiency (`cost.fp8_compute_eff`) fitted to aiconfigurator's measured
//! fp8 deployments, with k-fold held-out errors (part of `sim calibrate --observed`).
//!
//! fp8 GEMMs reach a smaller fraction of the fp8 tensor-core peak than 16-bit GEMMs reach
//! of theirs (scales applied per tensor or per block, narrower tiles, the activations
//! quantized on the fly), so the 16-bit efficiency makes fp8 deployments too fast: a
//! property of the kernels, not of one engine, so one value is fitted over every engine's
//! fp8 rows. Every fp8 row is simulated under each candidate, each under its engine's
//! serving defaults; per fold the candidate with the smallest sum of the median absolute
//! TTFT and TPOT errors on the other folds is chosen, and the held-out fold's errors under it
//! are kept. In: aiconfigurator's rows; out: an [`Fp8Fit`] and its file, whose value the
//! shipped default ([`crate::cost_model::CostParams`]) is.

use std::fmt::Write as _;

use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::observed::{median_abs, p90_abs};
use crate::cost_model::validation::silicon::{silicon_checks_with, EngineCost};
use crate::observed::silicon::AggregateRow;

/// The efficiencies tried, relative to `gemm_compute_eff`.
pub const FP8_CANDIDATES: [f64; 7] = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4];

/// The fit of the fp8 GEMM efficiency.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8Fit {
    /// fp8 rows simulated.
    pub rows: usize,
    /// The value fitted on every row.
    pub value: f64,
    /// Each fold's value.
    pub fold_values: Vec<f64>,
    /// Held-out signed TTFT and TPOT errors (one per row).
    pub held_out_ttft: Vec<f64>,
    /// See `held_out_ttft`.
    pub held_out_tpot: Vec<f64>,
    /// Errors at 1 (fp8 GEMMs as efficient as 16-bit ones).
    pub baseline_ttft: Vec<f64>,
    /// See `baseline_ttft`.
    pub baseline_tpot: Vec<f64>,
}

fn is_fp8(r: &AggregateRow) -> bool {
    matches!(r.gemm_quant.as_str(), "fp8" | "fp8_block")
}

/// Fits `cost.fp8_compute_eff` to the fp8 rows of `rows`, `folds`-fold. `None` when fewer
/// fp8 rows than folds can be simulated.
pub fn fit_fp8_efficiency(
    rows: &[AggregateRow],
    folds: usize,
) -> Result<Option<Fp8Fit>, crate::SimError> {
    let folds = folds.max(2);
    let mine: Vec<AggregateRow> = rows.iter().filter(|r| is_fp8(r)).cloned().collect();
    // (TTFT, TPOT) errors of every simulated fp8 row under each candidate.
    let mut errors: Vec<Vec<(f64, f64)>> = Vec::new();
    for &eff in &FP8_CANDIDATES {
        let (done, _) = silicon_checks_with(&mine, None, &|_| EngineCost {
            fp8_compute_eff: Some(eff),
            ..EngineCost::default()
        })?;
        errors.push(
            done.iter()
                .map(|k| (k.ttft_error(), k.tpot_error()))
                .collect(),
        );
    }
    let n = errors[0].len();
    if n < folds {
        return Ok(None);
    }
    let score = |c: usize, on: &[usize]| {
        let ttft: Vec<f64> = on.iter().map(|&i| errors[c][i].0).collect();
        let tpot: Vec<f64> = on.iter().map(|&i| errors[c][i].1).collect();
        median_abs(&ttft) + median_abs(&tpot)
    };
    let best = |on: &[usize]| {
        (0..FP8_CANDIDATES.len())
            .min_by(|&a, &b| score(a, on).total_cmp(&score(b, on)))
            .unwrap_or(0)
    };
    // The same fixed shuffle as the engines' fits, so folds mix GPUs, models and loads.
    let mut idx: Vec<usize> = (0..n).collect();
    idx.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(17));
    let mut fit = Fp8Fit {
        rows: n,
        value: FP8_CANDIDATES[best(&idx)],
        fold_values: Vec::new(),
        held_out_ttft: Vec::new(),
        held_out_tpot: Vec::new(),
        baseline_ttft: errors[0].iter().map(|e| e.0).collect(),
        baseline_tpot: errors[0].iter().map(|e| e.1).collect(),
    };
    for f in 0..folds {
        let train: Vec<usize> = (0..n).filter(|j| j % folds != f).map(|j| idx[j]).collect();
        let c = best(&train);
        fit.fold_values.push(FP8_CANDIDATES[c]);
        for j in (f..n).step_by(folds) {
            fit.held_out_ttft.push(errors[c][idx[j]].0);
            fit.held_out_tpot.push(errors[c][idx[j]].1);
        }
    }
    Ok(Some(fit))
}

impl Fp8Fit {
    /// One line: the value, its folds and the held-out errors against the baseline.
    pub fn summary(&self, folds: usize) -> String {
        let folds_list: Vec<String> = self.fold_values.iter().map(|v| format!("{v}")).collect();
        format!(
            "fp8_compute_eff = {} fitted to {} fp8 rows of every engine; {folds}-fold held-out: TTFT median |err| {:.1}%, p90 {:.1}% (at 1: {:.1}%, {:.1}%), TPOT median |err| {:.1}%, p90 {:.1}% (at 1: {:.1}%, {:.1}%); the folds' values: {}",
            self.value,
            self.rows,
            100.0 * median_abs(&self.held_out_ttft),
            100.0 * p90_abs(&self.held_out_ttft),
            100.0 * median_abs(&self.baseline_ttft),
            100.0 * p90_abs(&self.baseline_ttft),
            100.0 * median_abs(&self.held_out_tpot),
            100.0 * p90_abs(&self.held_out_tpot),
            100.0 * median_abs(&self.baseline_tpot),
            100.0 * p90_abs(&self.baseline_tpot),
            folds_list.join(", ")
        )
    }

    /// The calibration file: the value under `[cost]`, what it was fitted to in the header.
    pub fn toml(&self, source: &str, folds: usize) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# The fp8 GEMM efficiency relative to gemm_compute_eff, fitted by `sim calibrate --observed {source}`."
        );
        let _ = writeln!(s, "# {}.", self.summary(folds));
        let _ = writeln!(
            s,
            "# The shipped default of `cost.fp8_compute_eff` is this value (a test ties them)."
        );
        let _ = writeln!(s, "[cost]\nfp8_compute_eff = {}", self.value);
        s
    }
}
