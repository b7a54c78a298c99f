//! The spread of the aiperf clients' turnaround, per engine, fitted to the rows of
//! aiconfigurator's gap analysis (measured with aiperf) with k-fold held-out errors: the
//! `aiperf-turnaround` stage of `sim calibrate --observed`.
//!
//! A closed loop's TTFT is mostly how its clients' requests bunch into steps: sent the
//! instant a step ends, they stay in lockstep waves, each prompt queueing behind the wave's
//! others; spread over a step or more, they drift apart and each prefills almost alone.
//! The measured rows sit between the two. What spreads them is the turnaround nobody
//! records: aiperf hands a freed slot to a worker process, the worker sends the next
//! request, and the engine's HTTP server tokenizes it before its scheduler sees it. That
//! path is the engine's too (TensorRT-LLM's server shares a Python process with its
//! executor loop; vLLM's engine core runs in a process of its own), so the spread is
//! fitted per engine: each row is simulated under every candidate, and per fold each
//! engine's candidate with the smallest sum of the median absolute TTFT and TPOT errors on
//! the other folds is chosen and scored on the held-out one. In: the rows; out: one
//! [`TurnaroundFit`] per engine and the file whose values
//! [`crate::cost_model::validation::silicon::aiperf_turnaround_ms`] returns.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use super::efficiency::{folded, Folded};
use super::observed::{median_abs, p90_abs};
use crate::cost_model::validation::silicon::{silicon_checks_with, EngineCost};
use crate::observed::silicon::{AggregateRow, BenchClient};

/// The spreads tried, milliseconds (0: every request reaches the engine as the step that
/// ended its client's last does, the lockstep of identical requests).
pub const CANDIDATES: [f64; 8] = [0.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0];

/// The file the stage writes.
pub const FILE: &str = "aiperf-turnaround.toml";

/// One engine's fitted spread.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnaroundFit {
    /// The engine (`sglang`, `trtllm`, `vllm`).
    pub engine: String,
    /// Its spreads' k-fold choice (milliseconds) and errors, 0 ms the baseline (the clients
    /// in lockstep).
    pub fit: Folded,
}

/// Fits each engine's spread to the aiperf rows of `rows`, `folds`-fold, with the other
/// terms at `prior`. Engines with fewer rows than folds are left out.
pub fn fit_turnaround(
    rows: &[AggregateRow],
    folds: usize,
    prior: &EngineCost,
) -> Result<Vec<TurnaroundFit>, crate::SimError> {
    let folds = folds.max(2);
    let mine: Vec<AggregateRow> = rows
        .iter()
        .filter(|r| r.client == BenchClient::Aiperf)
        .cloned()
        .collect();
    // Each candidate's (engine, TTFT error, TPOT error) by row id.
    let mut by_candidate: Vec<HashMap<String, (String, f64, f64)>> = Vec::new();
    for &ms in &CANDIDATES {
        let cost = EngineCost {
            aiperf_turnaround_ms: Some(ms),
            ..*prior
        };
        let (done, _) = silicon_checks_with(&mine, None, &|_, _| cost)?;
        by_candidate.push(
            done.iter()
                .map(|k| {
                    let e = (k.row.backend.clone(), k.ttft_error(), k.tpot_error());
                    (k.row.id.clone(), e)
                })
                .collect(),
        );
    }
    // Rows every candidate simulated, by engine, in the file's order.
    let mut engines: BTreeMap<String, Vec<&String>> = BTreeMap::new();
    for r in &mine {
        if by_candidate.iter().all(|m| m.contains_key(&r.id)) {
            engines.entry(r.backend.clone()).or_default().push(&r.id);
        }
    }
    let mut fits = Vec::new();
    for (engine, ids) in engines {
        let n = ids.len();
        if n < folds {
            continue;
        }
        let errors: Vec<Vec<(f64, f64)>> = by_candidate
            .iter()
            .map(|m| ids.iter().map(|id| (m[*id].1, m[*id].2)).collect())
            .collect();
        let fit = TurnaroundFit {
            engine,
            fit: folded(&CANDIDATES, &errors, folds),
        };
        fits.push(fit);
    }
    Ok(fits)
}

/// `(median, p90)` of |errors|, in percent.
fn pct(v: &[f64]) -> (f64, f64) {
    (100.0 * median_abs(v), 100.0 * p90_abs(v))
}

impl TurnaroundFit {
    /// One line: the spread, its folds and the held-out errors against lockstep's.
    pub fn summary(&self, folds: usize) -> String {
        let (t, t90) = pct(&self.fit.held_out_ttft);
        let (b, b90) = pct(&self.fit.baseline_ttft);
        let (p, p90) = pct(&self.fit.held_out_tpot);
        let (bp, bp90) = pct(&self.fit.baseline_tpot);
        let list: Vec<String> = self
            .fit
            .fold_values
            .iter()
            .map(|v| format!("{v}"))
            .collect();
        format!(
            "{}: {} ms fitted to {} aiperf rows; {folds}-fold held-out: TTFT median |err| {t:.1}%, p90 {t90:.1}% (at 0 ms: {b:.1}%, {b90:.1}%), TPOT median |err| {p:.1}%, p90 {p90:.1}% (at 0 ms: {bp:.1}%, {bp90:.1}%); the folds' values: {}",
            self.engine,
            self.fit.value,
            self.fit.rows,
            list.join(", ")
        )
    }
}

/// Every engine's held-out errors together: `(TTFT median, p90, TPOT median, p90)` in
/// percent, then the same at 0 ms.
pub fn pooled(fits: &[TurnaroundFit]) -> ([f64; 4], [f64; 4]) {
    let cat = |f: fn(&TurnaroundFit) -> &Vec<f64>| -> Vec<f64> {
        fits.iter().flat_map(|x| f(x).iter().copied()).collect()
    };
    let (t, t90) = pct(&cat(|f| &f.fit.held_out_ttft));
    let (p, p90) = pct(&cat(|f| &f.fit.held_out_tpot));
    let (bt, bt90) = pct(&cat(|f| &f.fit.baseline_ttft));
    let (bp, bp90) = pct(&cat(|f| &f.fit.baseline_tpot));
    ([t, t90, p, p90], [bt, bt90, bp, bp90])
}

/// The calibration file: each engine's spread under `[aiperf_turnaround_ms]`, what it was
/// fitted to in the header.
pub fn toml(fits: &[TurnaroundFit], source: &str, folds: usize) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# The spread of the turnaround of aiconfigurator's aiperf clients per engine (each request reaches the engine a uniform draw in [0, this) milliseconds past the step that ended its client's last: aiperf's hand-off of a freed slot, the HTTP request, the server's tokenizer), fitted by `sim calibrate --observed {source}` to the rows aiperf measured."
    );
    let (h, b) = pooled(fits);
    let rows: usize = fits.iter().map(|f| f.fit.rows).sum();
    let _ = writeln!(
        s,
        "# Every engine's {rows} rows together, {folds}-fold held-out: TTFT median |err| {:.1}%, p90 {:.1}% (at 0 ms: {:.1}%, {:.1}%), TPOT median |err| {:.1}%, p90 {:.1}% (at 0 ms: {:.1}%, {:.1}%).",
        h[0], h[1], b[0], b[1], h[2], h[3], b[2], b[3]
    );
    for f in fits {
        let _ = writeln!(s, "# {}.", f.summary(folds));
        let _ = writeln!(
            s,
            "# {}: median |err| of TTFT / TPOT over its rows at each spread tried: {}.",
            f.engine,
            f.fit.landscape_text()
        );
    }
    let _ = writeln!(
        s,
        "# `sim validate-model` simulates those rows with these values (a test ties them); in a scenario the spread is a closed loop's `workload.arrival.think_jitter_s` (seconds)."
    );
    let _ = writeln!(s, "[aiperf_turnaround_ms]");
    for f in fits {
        let _ = writeln!(s, "{} = {:?}", f.engine, f.fit.value);
    }
    s
}
