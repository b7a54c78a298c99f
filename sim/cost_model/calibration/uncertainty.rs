//! What a calibration file says about its own uncertainty: the `[fit]` table that
//! `sim calibrate --observed` writes next to `[cost]`. It holds each fold's fit of the
//! `[cost]` keys (the k-fold fits: how much the fitted values move when a fifth of the
//! data is left out) and the held-out error intervals of TTFT and TPOT.
//!
//! In: the calibration file's `[fit]` table. Out: [`FitRecord`]; `sim run` reruns a
//! scenario under each fold's fit and turns the record into bands ([`crate::bands`]),
//! `sim plan` does the same for the rate a deployment sustains.

use serde::{Deserialize, Serialize};

use crate::cost_model::CostParams;

/// A calibration file's `[fit]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FitRecord {
    /// What was fitted, to what (one line).
    pub source: String,
    /// Each fold's fit: `[cost]` keys, as the file's `[cost]` table writes them.
    pub folds: Vec<toml::Table>,
    /// Held-out signed relative error `(sim - measured) / measured` of mean TTFT: its
    /// central 50% interval (25th and 75th percentiles).
    pub ttft_error_50: [f64; 2],
    /// ... and its central 90% interval (5th and 95th percentiles).
    pub ttft_error_90: [f64; 2],
    /// Held-out signed relative error of mean TPOT, central 50% interval.
    pub tpot_error_50: [f64; 2],
    /// ... and central 90% interval.
    pub tpot_error_90: [f64; 2],
    /// `[cost]` keys the scenario sets itself, which win over the file's and so over
    /// every fold's (not in the file: filled in when a scenario reads it).
    #[serde(skip)]
    pub pinned: Vec<String>,
}

impl FitRecord {
    /// Reads and checks `[fit]` (`None` when the file has none); errors name the key.
    pub fn from_file_table(file: &toml::Table) -> Result<Option<FitRecord>, String> {
        let Some(value) = file.get("fit") else {
            return Ok(None);
        };
        let fit: FitRecord = serde_path_to_error::deserialize(value.clone()).map_err(|e| {
            format!(
                "[fit] {}: {}",
                e.path(),
                crate::messages::concise(e.inner().message())
            )
        })?;
        for (i, fold) in fit.folds.iter().enumerate() {
            let p =
                serde_path_to_error::deserialize::<_, CostParams>(toml::Value::Table(fold.clone()))
                    .map_err(|e| {
                        format!(
                            "[fit] folds[{i}].{}: {}",
                            e.path(),
                            crate::messages::concise(e.inner().message())
                        )
                    })?;
            // A fold's values are run for the bands: out of range or an unknown format
            // would be run, or ignored, silently.
            p.validate().map_err(|e| format!("[fit] folds[{i}]: {e}"))?;
        }
        for (key, [lo, hi]) in [
            ("ttft_error_50", fit.ttft_error_50),
            ("ttft_error_90", fit.ttft_error_90),
            ("tpot_error_50", fit.tpot_error_50),
            ("tpot_error_90", fit.tpot_error_90),
        ] {
            if !(lo > -1.0 && lo <= hi && hi.is_finite()) {
                return Err(format!(
                    "[fit] {key}: expected [low, high] relative errors with -1 < low <= high, got [{lo}, {hi}]"
                ));
            }
        }
        Ok(Some(fit))
    }

    /// The folds' fits that differ from `cost` (what the scenario runs with), each once,
    /// in file order: the extra runs a band needs. A key that some fold sets and another
    /// omits is at its default in the one that omits it; a key the scenario sets itself
    /// ([`FitRecord::pinned`]) keeps the scenario's value in every fold.
    pub fn other_fits(&self, cost: &CostParams) -> Result<Vec<CostParams>, String> {
        let pinned = |k: &str| self.pinned.iter().any(|p| p == k);
        let fitted: std::collections::BTreeSet<&String> = self
            .folds
            .iter()
            .flat_map(|f| f.keys())
            .filter(|k| !pinned(k))
            .collect();
        let base = toml::Table::try_from(cost).map_err(|e| format!("[cost]: {e}"))?;
        let mut out: Vec<CostParams> = Vec::new();
        for (i, fold) in self.folds.iter().enumerate() {
            let mut table = base.clone();
            for k in &fitted {
                table.remove(k.as_str());
            }
            for (k, v) in fold.iter().filter(|(k, _)| !pinned(k)) {
                table.insert(k.clone(), v.clone());
            }
            let p = toml::Value::Table(table)
                .try_into::<CostParams>()
                .map_err(|e| format!("[fit] folds[{i}]: {}", e.message().trim()))?;
            if p != *cost && !out.contains(&p) {
                out.push(p);
            }
        }
        Ok(out)
    }

    /// The values a measurement takes when the simulator predicts `predicted` and its
    /// relative error `(sim - measured) / measured` lies in `[lo, hi]`:
    /// `[predicted / (1 + hi), predicted / (1 + lo)]`.
    pub fn measured_range(predicted: f64, [lo, hi]: [f64; 2]) -> (f64, f64) {
        (predicted / (1.0 + hi), predicted / (1.0 + lo))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(text: &str) -> Result<Option<FitRecord>, String> {
        FitRecord::from_file_table(&toml::from_str(text).expect("toml"))
    }

    const GOOD: &str = r#"
[cost]
step_overhead_us = 1500.0
[fit]
source = "test"
folds = [{ step_overhead_us = 1500.0, request_overhead_ms = 40.0 }, { step_overhead_us = 1500.0, request_overhead_ms = 80.0 }]
ttft_error_50 = [-0.3, 0.1]
ttft_error_90 = [-0.6, 0.5]
tpot_error_50 = [-0.05, 0.05]
tpot_error_90 = [-0.2, 0.3]
"#;

    #[test]
    fn reads_the_fit_and_lists_the_other_fits() {
        let fit = record(GOOD).expect("valid").expect("present");
        let cost = CostParams {
            step_overhead_us: Some(1500.0),
            request_overhead_ms: Some(40.0),
            ..CostParams::default()
        };
        let others = fit.other_fits(&cost).expect("folds apply");
        assert_eq!(others.len(), 1);
        assert_eq!(others[0].request_overhead_ms, Some(80.0));
        // A fold without the all-reduce latency that another fold fits runs with the
        // default, not with the file's own value.
        let mut fit = fit;
        fit.folds[0].insert("allreduce_latency_us".into(), toml::Value::Float(25.0));
        let cost = CostParams {
            allreduce_latency_us: Some(25.0),
            ..cost
        };
        let others = fit.other_fits(&cost).expect("folds apply");
        assert_eq!(others.len(), 1);
        assert_eq!(others[0].allreduce_latency_us, None);
        assert_eq!(record("[cost]\n").expect("valid"), None);
    }

    #[test]
    fn a_key_the_scenario_sets_stays_in_every_fold() {
        let mut fit = record(GOOD).expect("valid").expect("present");
        fit.pinned = vec!["request_overhead_ms".into()];
        let cost = CostParams {
            step_overhead_us: Some(1500.0),
            request_overhead_ms: Some(7.0),
            ..CostParams::default()
        };
        // Both folds differ only in the pinned key: no extra run.
        assert!(fit.other_fits(&cost).expect("folds apply").is_empty());
    }

    #[test]
    fn bad_fit_tables_name_the_key() {
        let e = record(&GOOD.replace("ttft_error_90 = [-0.6, 0.5]", "ttft_error_90 = [-1.5, 0.5]"))
            .expect_err("out of range");
        assert!(e.contains("ttft_error_90"), "{e}");
        let e = record(&GOOD.replace(
            "tpot_error_50 = [-0.05, 0.05]",
            "tpot_error_50 = [0.05, -0.05]",
        ))
        .expect_err("reversed");
        assert!(e.contains("tpot_error_50"), "{e}");
        let e = record(&GOOD.replace("request_overhead_ms = 80.0", "request_overhead = 80.0"))
            .expect_err("unknown cost key");
        assert!(
            e.contains("folds[1]") && e.contains("request_overhead"),
            "{e}"
        );
        // A fold's values are checked as a scenario's are: range, and expert formats.
        let e = record(&GOOD.replace("request_overhead_ms = 80.0", "request_overhead_ms = -80.0"))
            .expect_err("negative");
        assert!(
            e.contains("folds[1]") && e.contains("request_overhead_ms"),
            "{e}"
        );
        let e = record(&GOOD.replace(
            "request_overhead_ms = 80.0",
            "by_gpu = { h200 = { experts = { fp6 = { moe_gemm_eff = 0.5 } } } }",
        ))
        .expect_err("unknown format");
        assert!(
            e.contains("folds[1]") && e.contains("cost.by_gpu.h200.experts.fp6"),
            "{e}"
        );
        let e = record(&GOOD.replace("source = \"test\"", "source = \"test\"\nextra = 1"))
            .expect_err("unknown key");
        assert!(e.contains("extra"), "{e}");
    }

    #[test]
    fn measured_range_inverts_the_relative_error() {
        // Predicted 120: a +20% error means 100 was measured, a -20% error 150.
        let (lo, hi) = FitRecord::measured_range(120.0, [-0.2, 0.2]);
        assert!((lo - 100.0).abs() < 1e-9 && (hi - 150.0).abs() < 1e-9);
    }
}
