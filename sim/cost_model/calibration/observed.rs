//! `sim calibrate --observed`: the cost model's per-request front-end cost
//! (`cost.request_overhead_ms`) fitted per engine to aiconfigurator's measured deployments,
//! with k-fold held-out errors.
//!
//! Every simulable row is simulated once per candidate cost ([`CANDIDATES_MS`], the
//! closed loop of [`crate::cost_model::validation::silicon`]); then, per engine and per
//! fold, the candidate with the smallest median absolute TTFT error on the other folds is
//! chosen and its errors on the held-out fold are kept. Reported errors are those held-out
//! errors; the spread of the fold fits is the fit's uncertainty. The fit on all rows is what
//! the calibration file carries.

use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::cost_model::validation::silicon::{silicon_checks_with, SiliconCheck};
use crate::observed::silicon::AggregateRow;

/// The front-end costs tried, milliseconds.
pub const CANDIDATES_MS: [f64; 8] = [0.0, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0];

/// One engine's fit.
#[derive(Debug, Clone)]
pub struct EngineFit {
    /// Engine (`vllm`, `sglang`, `trtllm`).
    pub engine: String,
    /// Rows fitted.
    pub rows: usize,
    /// The cost fitted on every row (ms).
    pub request_overhead_ms: f64,
    /// The cost each fold's fit chose (ms).
    pub fold_fits_ms: Vec<f64>,
    /// Held-out signed TTFT errors (one per row).
    pub held_out_ttft: Vec<f64>,
    /// Held-out signed TPOT errors (one per row).
    pub held_out_tpot: Vec<f64>,
    /// In-sample TTFT errors without any front-end cost (the baseline).
    pub baseline_ttft: Vec<f64>,
}

/// The median of the absolute values.
pub fn median_abs(v: &[f64]) -> f64 {
    let a: Vec<f64> = v.iter().map(|x| x.abs()).collect();
    analysis::median(&a)
}

/// Fits the front-end cost per engine with `folds`-fold cross-validation.
pub fn fit_request_overhead(
    rows: &[AggregateRow],
    folds: usize,
) -> Result<Vec<EngineFit>, crate::SimError> {
    // errors[c][i]: row i's (TTFT, TPOT) errors with candidate c.
    let mut errors: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut checks: Vec<SiliconCheck> = Vec::new();
    for &c in &CANDIDATES_MS {
        let (done, _) = silicon_checks_with(rows, None, &|_| Some(c))?;
        errors.push(
            done.iter()
                .map(|k| (k.ttft_error(), k.tpot_error()))
                .collect(),
        );
        checks = done;
    }
    let mut engines: Vec<String> = checks.iter().map(|c| c.row.backend.clone()).collect();
    engines.sort();
    engines.dedup();
    let folds = folds.max(2);
    let mut fits = Vec::new();
    for engine in engines {
        let mut idx: Vec<usize> = (0..checks.len())
            .filter(|&i| checks[i].row.backend == engine)
            .collect();
        if idx.len() < folds {
            continue;
        }
        // A fixed shuffle, so folds mix GPUs, models and concurrencies.
        idx.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(17));
        let best = |train: &[usize]| -> usize {
            (0..CANDIDATES_MS.len())
                .min_by(|&a, &b| {
                    let e = |c: usize| {
                        median_abs(&train.iter().map(|&i| errors[c][i].0).collect::<Vec<_>>())
                    };
                    e(a).total_cmp(&e(b))
                })
                .unwrap_or(0)
        };
        let mut held_out_ttft = Vec::new();
        let mut held_out_tpot = Vec::new();
        let mut fold_fits_ms = Vec::new();
        for f in 0..folds {
            let test: Vec<usize> = (f..idx.len()).step_by(folds).map(|j| idx[j]).collect();
            let train: Vec<usize> = (0..idx.len())
                .filter(|j| j % folds != f)
                .map(|j| idx[j])
                .collect();
            let c = best(&train);
            fold_fits_ms.push(CANDIDATES_MS[c]);
            for &i in &test {
                held_out_ttft.push(errors[c][i].0);
                held_out_tpot.push(errors[c][i].1);
            }
        }
        let all = best(&idx);
        fits.push(EngineFit {
            engine,
            rows: idx.len(),
            request_overhead_ms: CANDIDATES_MS[all],
            fold_fits_ms,
            held_out_ttft,
            held_out_tpot,
            baseline_ttft: idx.iter().map(|&i| errors[0][i].0).collect(),
        });
    }
    Ok(fits)
}

/// The calibration file of one engine's fit.
pub fn fit_toml(fit: &EngineFit, source: &str, folds: usize) -> String {
    let framework = if fit.engine == "trtllm" {
        "tensorrt-llm"
    } else {
        "vllm-v1"
    };
    let (lo, hi) = fit
        .fold_fits_ms
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &x| {
            (l.min(x), h.max(x))
        });
    format!(
        "# {engine}: the per-request front-end cost fitted by `sim calibrate --observed {source}`\n\
         # to {rows} measured closed-loop deployments of {engine} (aiconfigurator silicon.csv).\n\
         # {folds}-fold held-out: TTFT median |err| {t:.1}% (without the cost: {b:.1}%), TPOT median\n\
         # |err| {p:.1}%; the folds' fits range {lo:.0}-{hi:.0} ms.{edge}\n\
         [cost]\nframework = \"{framework}\"\nrequest_overhead_ms = {ms:.1}\n",
        engine = fit.engine,
        rows = fit.rows,
        t = 100.0 * median_abs(&fit.held_out_ttft),
        b = 100.0 * median_abs(&fit.baseline_ttft),
        p = 100.0 * median_abs(&fit.held_out_tpot),
        ms = fit.request_overhead_ms,
        edge = if fit.request_overhead_ms >= CANDIDATES_MS[CANDIDATES_MS.len() - 1] {
            "\n# At the largest cost tried: a constant front-end cost does not explain these rows."
        } else {
            ""
        },
    )
}

/// The fits as a table (held-out errors in percent).
pub fn fit_table(fits: &[EngineFit]) -> String {
    let mut s = String::from(
        "engine   rows  fit ms  fold fits ms      TTFT |err| held out (p50, p90)  without   TPOT |err| held out (p50, p90)\n",
    );
    for f in fits {
        let abs = |v: &[f64]| v.iter().map(|x| 100.0 * x.abs()).collect::<Vec<f64>>();
        let (t, p) = (abs(&f.held_out_ttft), abs(&f.held_out_tpot));
        let folds: Vec<String> = f.fold_fits_ms.iter().map(|x| format!("{x:.0}")).collect();
        s.push_str(&format!(
            "{:<8} {:>4} {:>7.0}  {:<16} {:>8.1}% {:>8.1}%             {:>6.1}%   {:>8.1}% {:>8.1}%\n",
            f.engine,
            f.rows,
            f.request_overhead_ms,
            folds.join(","),
            analysis::median(&t),
            analysis::percentile(&t, 90.0),
            100.0 * median_abs(&f.baseline_ttft),
            analysis::median(&p),
            analysis::percentile(&p, 90.0),
        ));
    }
    s
}
