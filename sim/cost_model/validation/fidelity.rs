//! The calibrated cost model against a real backend (`sim fidelity SCENARIO --calibration
//! FILE`): the scenario runs on the real backend and on the cost model with the same seed;
//! per variant and metric the simulated value, the measured one and the error
//! ([`fidelity_rows`]), written as a table and `fidelity.csv` ([`fidelity_outputs`]).

use std::fmt::Write as _;
use std::path::Path;

use analysis::Summary;

/// One line of a fidelity report.
#[derive(Debug, Clone, PartialEq)]
pub struct FidelityRow {
    /// Variant.
    pub variant: String,
    /// Metric.
    pub metric: String,
    /// The calibrated cost model's value.
    pub simulated: f64,
    /// The real backend's.
    pub measured: f64,
}

impl FidelityRow {
    /// (simulated - measured) / measured.
    pub fn error(&self) -> f64 {
        (self.simulated - self.measured) / self.measured
    }
}

/// Percentiles 50, 90, 99 of a run's step durations (ms) from its `steps.csv`.
pub fn step_percentiles(dir: &Path) -> Result<[f64; 3], String> {
    let path = dir.join("steps.csv");
    let shown = path.display();
    let mut r = csv::Reader::from_path(&path).map_err(|e| format!("{shown}: {e}"))?;
    let h = r.headers().map_err(|e| format!("{shown}: {e}"))?.clone();
    let i = h
        .iter()
        .position(|c| c == "duration_ms")
        .ok_or_else(|| format!("{shown}: no duration_ms column"))?;
    let mut v: Vec<f64> = Vec::new();
    for rec in r.records() {
        let rec = rec.map_err(|e| format!("{shown}: {e}"))?;
        if let Some(x) = rec.get(i).and_then(|x| x.parse::<f64>().ok()) {
            v.push(x);
        }
    }
    v.sort_by(f64::total_cmp);
    Ok([50.0, 90.0, 99.0].map(|q| analysis::percentile(&v, q)))
}

/// The fidelity rows of one variant: TTFT, TPOT and E2EL at p50/p90/p99, request and
/// output throughput, and the step-time distribution (p50/p90/p99 of `steps.csv`).
pub fn fidelity_rows(
    variant: &str,
    sim: &Summary,
    real: &Summary,
    sim_steps: [f64; 3],
    real_steps: [f64; 3],
) -> Vec<FidelityRow> {
    type Get = fn(&Summary) -> f64;
    let metrics: [(&str, Get); 11] = [
        ("p50 TTFT (ms)", |s| s.median_ttft_ms),
        ("p90 TTFT (ms)", |s| s.p90_ttft_ms),
        ("p99 TTFT (ms)", |s| s.p99_ttft_ms),
        ("p50 TPOT (ms)", |s| s.median_tpot_ms),
        ("p90 TPOT (ms)", |s| s.p90_tpot_ms),
        ("p99 TPOT (ms)", |s| s.p99_tpot_ms),
        ("p50 E2EL (ms)", |s| s.median_e2el_ms),
        ("p90 E2EL (ms)", |s| s.p90_e2el_ms),
        ("p99 E2EL (ms)", |s| s.p99_e2el_ms),
        ("request throughput (req/s)", |s| s.request_throughput),
        ("output throughput (tok/s)", |s| s.output_throughput),
    ];
    let mut rows: Vec<FidelityRow> = metrics
        .iter()
        .map(|(name, get)| FidelityRow {
            variant: variant.into(),
            metric: (*name).into(),
            simulated: get(sim),
            measured: get(real),
        })
        .collect();
    for (i, q) in ["p50", "p90", "p99"].iter().enumerate() {
        rows.push(FidelityRow {
            variant: variant.into(),
            metric: format!("{q} step time (ms)"),
            simulated: sim_steps[i],
            measured: real_steps[i],
        });
    }
    rows
}

/// The fidelity table and its CSV text.
pub fn fidelity_outputs(rows: &[FidelityRow]) -> (String, String) {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::ASCII_FULL_CONDENSED);
    t.set_header(["variant", "metric", "simulated", "measured", "error"]);
    let mut csv = String::from("variant,metric,simulated,measured,error\n");
    for r in rows {
        let e = r.error();
        t.add_row([
            r.variant.clone(),
            r.metric.clone(),
            format!("{:.3}", r.simulated),
            format!("{:.3}", r.measured),
            if e.is_finite() {
                format!("{:+.1}%", 100.0 * e)
            } else {
                "-".into()
            },
        ]);
        let _ = writeln!(
            csv,
            "{},{},{:.6},{:.6},{}",
            r.variant,
            r.metric,
            r.simulated,
            r.measured,
            if e.is_finite() {
                format!("{e:.6}")
            } else {
                String::new()
            }
        );
    }
    (t.to_string(), csv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fidelity_rows_report_relative_errors() {
        let a = Summary {
            median_ttft_ms: 110.0,
            request_throughput: 9.0,
            ..Summary::default()
        };
        let b = Summary {
            median_ttft_ms: 100.0,
            request_throughput: 10.0,
            ..Summary::default()
        };
        let rows = fidelity_rows("v", &a, &b, [1.1, 2.0, 3.0], [1.0, 2.0, 3.0]);
        assert_eq!(rows.len(), 14);
        assert!((rows[0].error() - 0.1).abs() < 1e-12);
        let thr = rows
            .iter()
            .find(|r| r.metric.starts_with("request"))
            .expect("row");
        assert!((thr.error() + 0.1).abs() < 1e-12);
        let (table, csv) = fidelity_outputs(&rows);
        assert!(table.contains("+10.0%"));
        assert_eq!(csv.lines().count(), 15);
    }
}
