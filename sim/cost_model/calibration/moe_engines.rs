//! Each engine's own mixture-of-experts kernels (part of `sim calibrate --observed`, stage
//! `moe-engines`): the grouped-GEMM efficiency it reaches on each GPU
//! (`[cost.by_gpu.<gpu>] moe_gemm_eff`), fitted per engine to its mixture-of-experts rows
//! with the shared MoE terms (`moe-*.toml`, the defaults) in place.
//!
//! The shared `cost.moe_gemm_eff` is one value over every engine's rows, but the engines run
//! different expert kernels: vLLM's block-fp8 Triton MoE on Hoppers streams Qwen3-235B's
//! experts at a fraction of what TensorRT-LLM's do, vLLM's Marlin MXFP4 MoE runs gpt-oss
//! faster than the shared fit prices it. Per engine, every MoE row is simulated under each
//! candidate (one candidate applies to every GPU in a pass; a row feels only its own GPU's,
//! so per-GPU choices come from the same passes); per fold each GPU takes the candidate with
//! the smallest sum of the median absolute TTFT and TPOT errors on its rows of the other
//! folds, and the held-out fold's errors under those choices are kept.
//!
//! In: aiconfigurator's rows; out: a [`MoeEngineFit`] per engine, written as
//! `observed-moe-<engine>.toml` (a scenario's `cost.calibration` for a mixture of experts
//! served by that engine, with a `[fit]` table for `sim run`'s bands) and its rows' held-out
//! errors (`observed-moe-<engine>.rows.csv`).

use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::observed::{
    fit_record_toml, framework_name, held_out_csv, median_abs, p90_abs, pass_with_ids, per_gpu,
    under,
};
use crate::cost_model::validation::silicon::{self, EngineCost};
use crate::observed::silicon::AggregateRow;

/// The grouped-GEMM efficiencies tried on each GPU (`None`: the shared fit's, the prior's).
pub const CANDIDATES: [Option<f64>; 5] = [None, Some(0.3), Some(0.45), Some(0.8), Some(1.0)];
const _: () = assert!(CANDIDATES[0].is_none());

/// One engine's fit.
#[derive(Debug, Clone)]
pub struct MoeEngineFit {
    /// Engine (`vllm`, `sglang`, `trtllm`).
    pub engine: String,
    /// Rows fitted.
    pub rows: usize,
    /// The shared grouped-GEMM efficiency the candidates replace.
    pub shared: f64,
    /// `(GPU, moe_gemm_eff)` fitted on every row, where it departs from the shared value.
    pub by_gpu: Vec<(&'static str, f64)>,
    /// Each fold's `(GPU, moe_gemm_eff)`.
    pub fold_fits: Vec<Vec<(&'static str, f64)>>,
    /// Held-out signed TTFT errors (one per row).
    pub held_out_ttft: Vec<f64>,
    /// Held-out signed TPOT errors (one per row).
    pub held_out_tpot: Vec<f64>,
    /// `(row index, fold)` of each held-out error.
    pub held_out_rows: Vec<(usize, usize)>,
    /// TTFT errors under the shared terms (the baseline), by row index.
    pub baseline_ttft: Vec<f64>,
    /// TPOT errors under the shared terms, by row index.
    pub baseline_tpot: Vec<f64>,
    /// The rows' ids, by index.
    pub ids: Vec<String>,
}

/// The non-default choices as `(GPU, value)`.
fn values(choice: &[(&'static str, usize)]) -> Vec<(&'static str, f64)> {
    choice
        .iter()
        .filter_map(|&(g, c)| CANDIDATES[c].map(|e| (g, e)))
        .collect()
}

/// Fits each engine's grouped-GEMM efficiency per GPU on its mixture-of-experts rows,
/// `folds`-fold, with `prior`'s terms (the shared fits) in place.
pub fn fit_moe_engines(
    rows: &[AggregateRow],
    folds: usize,
    prior: &EngineCost,
) -> Result<Vec<MoeEngineFit>, crate::SimError> {
    let folds = folds.max(2);
    let mut engines: Vec<String> = rows
        .iter()
        .filter(|r| r.is_moe())
        .map(|r| r.backend.clone())
        .collect();
    engines.sort();
    engines.dedup();
    let shared = prior
        .moe_gemm_eff
        .unwrap_or(crate::cost_model::CostParams::default().moe_gemm_eff);
    let mut fits = Vec::new();
    for engine in engines {
        let mine: Vec<AggregateRow> = rows
            .iter()
            .filter(|r| r.backend == engine && r.is_moe())
            .cloned()
            .collect();
        // Each candidate's errors by row id; compared on the rows every candidate simulated
        // (the efficiency does not change what fits in memory, so all of them), in the
        // first pass's order.
        let mut passes = Vec::new();
        for eff in CANDIDATES {
            passes.push(pass_with_ids(&mine, &|_| EngineCost {
                moe_gemm_eff: eff.or(prior.moe_gemm_eff),
                ..*prior
            })?);
        }
        let maps: Vec<std::collections::HashMap<&str, (f64, f64)>> = passes
            .iter()
            .map(|(ids, _, errors)| {
                ids.iter()
                    .map(String::as_str)
                    .zip(errors.iter().copied())
                    .collect()
            })
            .collect();
        let (first_ids, first_gpus, _) = &passes[0];
        let keep: Vec<usize> = (0..first_ids.len())
            .filter(|&i| maps.iter().all(|m| m.contains_key(first_ids[i].as_str())))
            .collect();
        let ids: Vec<String> = keep.iter().map(|&i| first_ids[i].clone()).collect();
        let gpus: Vec<&'static str> = keep.iter().map(|&i| first_gpus[i]).collect();
        let by: Vec<Vec<(f64, f64)>> = maps
            .iter()
            .map(|m| ids.iter().map(|id| m[id.as_str()]).collect())
            .collect();
        let n = ids.len();
        if n < folds {
            continue;
        }
        // The engines' fits' fixed shuffle, so folds mix GPUs, models and loads.
        let mut idx: Vec<usize> = (0..n).collect();
        idx.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(17));
        let mut fit = MoeEngineFit {
            engine,
            rows: n,
            shared,
            by_gpu: values(&per_gpu(&by, &gpus, &idx).0),
            fold_fits: Vec::new(),
            held_out_ttft: Vec::new(),
            held_out_tpot: Vec::new(),
            held_out_rows: Vec::new(),
            baseline_ttft: by[0].iter().map(|e| e.0).collect(),
            baseline_tpot: by[0].iter().map(|e| e.1).collect(),
            ids,
        };
        for f in 0..folds {
            let train: Vec<usize> = (0..n).filter(|j| j % folds != f).map(|j| idx[j]).collect();
            let (choice, _) = per_gpu(&by, &gpus, &train);
            let errors = under(&by, &choice, &gpus);
            for j in (f..n).step_by(folds) {
                let i = idx[j];
                fit.held_out_ttft.push(errors[i].0);
                fit.held_out_tpot.push(errors[i].1);
                fit.held_out_rows.push((i, f));
            }
            fit.fold_fits.push(values(&choice));
        }
        fits.push(fit);
    }
    Ok(fits)
}

/// `b200 0.80, h200 0.45` (or `shared 0.6 everywhere`).
fn describe(v: &[(&'static str, f64)], shared: f64) -> String {
    if v.is_empty() {
        return format!("shared {shared} everywhere");
    }
    v.iter()
        .map(|(g, e)| format!("{g} {e:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The calibration file of one engine's fit: `[cost.by_gpu.<gpu>] moe_gemm_eff` and the
/// `[fit]` table.
pub fn fit_toml(fit: &MoeEngineFit, source: &str, folds: usize) -> String {
    let folds_text: Vec<String> = fit
        .fold_fits
        .iter()
        .map(|f| describe(f, fit.shared))
        .collect();
    let framework = framework_name(&fit.engine);
    let mut text = format!(
        "# {engine}: the grouped-GEMM efficiency of its mixture-of-experts kernels on each GPU, fitted by\n\
         # `sim calibrate --observed {source}` to {rows} mixture-of-experts rows of {engine} (aiconfigurator\n\
         # silicon.csv) with the shared MoE terms (moe-*.toml, the defaults) in place. {folds}-fold held-out: TTFT median |err| {t:.1}%,\n\
         # p90 {t90:.1}% (shared: {bt:.1}%), TPOT median |err| {p:.1}%, p90 {p90:.1}% (shared: {bp:.1}%); the folds' fits: {ff}.\n\
         # Held out of this fit only: the shared terms under it were fitted to every engine's rows, these included.\n\
         # For a mixture of experts served by {engine}: `cost.calibration` = this file (not with observed-{engine}.toml,\n\
         # whose terms were fitted to dense models and not used here). GPUs not listed keep the shared\n\
         # `moe_gemm_eff` ({shared}). Fitted under the engine's serving defaults (`sim validate-model`): [engine] {keys}.\n\
         [cost]\nframework = \"{framework}\"\n",
        keys = silicon::engine_keys(&fit.engine),
        engine = fit.engine,
        rows = fit.rows,
        t = 100.0 * median_abs(&fit.held_out_ttft),
        t90 = 100.0 * p90_abs(&fit.held_out_ttft),
        bt = 100.0 * median_abs(&fit.baseline_ttft),
        p = 100.0 * median_abs(&fit.held_out_tpot),
        p90 = 100.0 * p90_abs(&fit.held_out_tpot),
        bp = 100.0 * median_abs(&fit.baseline_tpot),
        ff = folds_text.join(" / "),
        shared = fit.shared,
    );
    let table = |v: &[(&'static str, f64)]| -> String {
        let entries: Vec<String> = v
            .iter()
            .map(|(g, e)| format!("{g} = {{ moe_gemm_eff = {e:.2} }}"))
            .collect();
        format!("{{ by_gpu = {{ {} }} }}", entries.join(", "))
    };
    for (g, e) in &fit.by_gpu {
        text.push_str(&format!("[cost.by_gpu.{g}]\nmoe_gemm_eff = {e:.2}\n"));
    }
    let folds_list: Vec<String> = fit.fold_fits.iter().map(|f| table(f)).collect();
    text.push_str(&fit_record_toml(
        &format!(
            "sim calibrate --observed {source}: grouped-GEMM efficiency per GPU of {}, {folds}-fold on {} mixture-of-experts rows",
            fit.engine, fit.rows
        ),
        &folds_list,
        &fit.held_out_ttft,
        &fit.held_out_tpot,
    ));
    text
}

/// Every row's held-out errors beside the shared terms' (as the engines' fits write them).
pub fn fit_rows_csv(fit: &MoeEngineFit) -> Result<String, crate::SimError> {
    held_out_csv(
        &format!("observed-moe-{}.rows.csv", fit.engine),
        &fit.ids,
        &fit.held_out_rows,
        (&fit.held_out_ttft, &fit.held_out_tpot),
        (&fit.baseline_ttft, &fit.baseline_tpot),
    )
}

/// The fits as a table, with every engine's rows together (held-out errors in percent).
pub fn fit_table(fits: &[MoeEngineFit]) -> String {
    let mut s = String::from(
        "engine   rows  moe_gemm_eff by GPU                  TTFT |err| held out p50 / p90 (shared p50)   TPOT |err| held out p50 / p90 (shared p50)\n",
    );
    let mut all = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut line = |name: &str,
                    rows: usize,
                    effs: &str,
                    t: &[f64],
                    p: &[f64],
                    bt: &[f64],
                    bp: &[f64]| {
        s.push_str(&format!(
            "{name:<8} {rows:>4}  {effs:<36} {:>8.1}% / {:>6.1}% ({:>5.1}%)              {:>8.1}% / {:>6.1}% ({:>5.1}%)\n",
            100.0 * median_abs(t),
            100.0 * p90_abs(t),
            100.0 * median_abs(bt),
            100.0 * median_abs(p),
            100.0 * p90_abs(p),
            100.0 * median_abs(bp),
        ));
    };
    for f in fits {
        line(
            &f.engine,
            f.rows,
            &describe(&f.by_gpu, f.shared),
            &f.held_out_ttft,
            &f.held_out_tpot,
            &f.baseline_ttft,
            &f.baseline_tpot,
        );
        all.0.extend_from_slice(&f.held_out_ttft);
        all.1.extend_from_slice(&f.held_out_tpot);
        all.2.extend_from_slice(&f.baseline_ttft);
        all.3.extend_from_slice(&f.baseline_tpot);
    }
    if fits.len() > 1 {
        line("all", all.0.len(), "", &all.0, &all.1, &all.2, &all.3);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::{describe, fit_toml, MoeEngineFit};

    /// The file a fit writes is a calibration file a scenario reads: its `[cost]` and
    /// `[fit]` tables parse, and each GPU's efficiency lands under `by_gpu`.
    #[test]
    fn the_fit_file_is_a_calibration_a_scenario_reads() {
        let fit = MoeEngineFit {
            engine: "vllm".into(),
            rows: 4,
            shared: 0.6,
            by_gpu: vec![("h100-sxm", 1.0), ("h200", 0.45)],
            fold_fits: vec![vec![("h200", 0.45)], vec![]],
            held_out_ttft: vec![0.1, -0.2, 0.05, 0.3],
            held_out_tpot: vec![0.02, -0.1, 0.04, 0.0],
            held_out_rows: vec![(0, 0), (1, 0), (2, 1), (3, 1)],
            baseline_ttft: vec![0.2, -0.3, 0.1, 0.4],
            baseline_tpot: vec![0.3, -0.4, 0.2, 0.1],
            ids: (0..4).map(|i| format!("row{i}")).collect(),
        };
        let text = fit_toml(&fit, "silicon.csv", 2);
        let table: toml::Table = text.parse().expect("TOML");
        let cost: crate::cost_model::CostParams =
            toml::Value::Table(table["cost"].as_table().unwrap().clone())
                .try_into()
                .expect("[cost]");
        assert_eq!(cost.on_gpu("h200").moe_gemm_eff, 0.45);
        assert_eq!(cost.on_gpu("h100-sxm").moe_gemm_eff, 1.0);
        assert_eq!(cost.on_gpu("b200").moe_gemm_eff, cost.moe_gemm_eff);
        let record =
            crate::cost_model::calibration::uncertainty::FitRecord::from_file_table(&table)
                .expect("[fit]")
                .expect("present");
        assert_eq!(record.folds.len(), 2);
        assert_eq!(describe(&[], 0.6), "shared 0.6 everywhere");
    }
}
