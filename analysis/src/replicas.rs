//! Replicas across seeds and comparisons of result sets (`sim run --seeds N`, `sim
//! compare A B`): per variant and metric the mean over replicas with a 95% confidence
//! interval from Student's t distribution (statrs), and between two result sets the
//! relative change with Welch's t-test.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use statrs::distribution::{ContinuousCDF, StudentsT};

use crate::error::AnalysisError;
use crate::summary::{read_summary_json, Summary};

/// A metric of a summary: label, getter, and whether higher is better.
pub type Metric = (&'static str, fn(&Summary) -> f64, bool);

/// The metrics compared.
pub const METRICS: [Metric; 10] = [
    ("request_throughput", |s| s.request_throughput, true),
    ("output_throughput", |s| s.output_throughput, true),
    (
        "request_goodput",
        |s| s.request_goodput.unwrap_or(f64::NAN),
        true,
    ),
    ("mean_ttft_ms", |s| s.mean_ttft_ms, false),
    ("p99_ttft_ms", |s| s.p99_ttft_ms, false),
    ("mean_tpot_ms", |s| s.mean_tpot_ms, false),
    ("p99_tpot_ms", |s| s.p99_tpot_ms, false),
    ("mean_e2el_ms", |s| s.mean_e2el_ms, false),
    ("p99_e2el_ms", |s| s.p99_e2el_ms, false),
    ("num_preemptions", |s| s.num_preemptions as f64, false),
];

/// Mean and 95% confidence interval of replicas.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    /// Replicas.
    pub n: usize,
    /// Mean.
    pub mean: f64,
    /// Sample standard deviation (n - 1).
    pub std: f64,
    /// Half-width of the 95% interval (`t(0.975, n - 1) std / sqrt(n)`; 0 for one
    /// replica).
    pub half: f64,
}

/// The interval of `values` (finite ones).
pub fn interval(values: &[f64]) -> Interval {
    let v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    let n = v.len();
    if n == 0 {
        return Interval {
            n,
            mean: f64::NAN,
            std: f64::NAN,
            half: f64::NAN,
        };
    }
    let mean = v.iter().sum::<f64>() / n as f64;
    if n == 1 {
        return Interval {
            n,
            mean,
            std: 0.0,
            half: 0.0,
        };
    }
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let std = var.sqrt();
    let t = StudentsT::new(0.0, 1.0, (n - 1) as f64)
        .map(|d| d.inverse_cdf(0.975))
        .unwrap_or(f64::NAN);
    Interval {
        n,
        mean,
        std,
        half: t * std / (n as f64).sqrt(),
    }
}

/// Welch's t-test of two samples: the two-sided p-value (NaN when undefined).
pub fn welch_p(a: &Interval, b: &Interval) -> f64 {
    if a.n < 2 || b.n < 2 {
        return f64::NAN;
    }
    let (va, vb) = (a.std.powi(2) / a.n as f64, b.std.powi(2) / b.n as f64);
    let se = (va + vb).sqrt();
    if se == 0.0 {
        return if a.mean == b.mean { 1.0 } else { 0.0 };
    }
    let t = (b.mean - a.mean) / se;
    let df = (va + vb).powi(2) / (va.powi(2) / (a.n - 1) as f64 + vb.powi(2) / (b.n - 1) as f64);
    StudentsT::new(0.0, 1.0, df)
        .map(|d| 2.0 * (1.0 - d.cdf(t.abs())))
        .unwrap_or(f64::NAN)
}

/// A result set: per variant, the summaries of its replicas.
pub type ResultSet = BTreeMap<String, Vec<Summary>>;

/// Reads a result set: a run folder (`<variant>/summary.json`: one replica each) or a
/// folder of replicas (`seed-*/<variant>/summary.json`).
pub fn read_result_set(dir: &Path) -> Result<ResultSet, AnalysisError> {
    let mut entries: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| AnalysisError::io(dir, e))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    entries.sort();
    let replicas: Vec<&std::path::PathBuf> = entries
        .iter()
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("seed-"))
        })
        .collect();
    let runs = replicas;
    if runs.is_empty() {
        return read_runs(&[dir.to_path_buf()]);
    }
    read_runs(&runs.into_iter().cloned().collect::<Vec<_>>())
}

/// The result set of these run folders (each `<variant>/summary.json`), one replica per
/// folder.
pub fn read_runs(runs: &[std::path::PathBuf]) -> Result<ResultSet, AnalysisError> {
    let mut set = ResultSet::new();
    let mut add = |run: &Path| -> Result<(), AnalysisError> {
        let mut vs = crate::report::run_variants(run)?;
        vs.sort();
        for v in vs {
            let s = read_summary_json(&run.join(v).join("summary.json"))?;
            set.entry(s.variant.clone()).or_default().push(s);
        }
        Ok(())
    };
    for r in runs {
        add(r)?;
    }
    if set.is_empty() {
        return Err(AnalysisError::Invalid {
            path: runs
                .first()
                .map_or(Path::new("."), |p| p.as_path())
                .to_path_buf(),
            message: "no results here (no <variant>/summary.json, no seed-*/ replicas)".into(),
        });
    }
    Ok(set)
}

fn fmt_interval(i: &Interval) -> String {
    if !i.mean.is_finite() {
        "-".into()
    } else if i.n > 1 {
        format!("{:.3} ± {:.3}", i.mean, i.half)
    } else {
        format!("{:.3}", i.mean)
    }
}

/// The table of one result set: per variant and metric, mean ± 95% half-width.
pub fn replicas_table(set: &ResultSet) -> String {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::ASCII_FULL_CONDENSED);
    let mut header = vec!["metric (mean ± 95% CI)".to_string()];
    header.extend(set.iter().map(|(v, s)| format!("{v} (n = {})", s.len())));
    t.set_header(header);
    for (name, get, _) in METRICS {
        let mut row = vec![name.to_string()];
        row.extend(set.values().map(|s| {
            let vals: Vec<f64> = s.iter().map(get).collect();
            fmt_interval(&interval(&vals))
        }));
        t.add_row(row);
    }
    t.to_string()
}

/// One line of a comparison.
#[derive(Debug, Clone)]
pub struct Delta {
    /// Variant.
    pub variant: String,
    /// Metric.
    pub metric: &'static str,
    /// Set A.
    pub a: Interval,
    /// Set B.
    pub b: Interval,
    /// (B - A) / A.
    pub change: f64,
    /// Welch's two-sided p-value.
    pub p: f64,
}

/// Compares the variants two result sets share.
pub fn compare(a: &ResultSet, b: &ResultSet) -> Vec<Delta> {
    let mut out = Vec::new();
    for (variant, sa) in a {
        let Some(sb) = b.get(variant) else { continue };
        for (metric, get, _) in METRICS {
            let ia = interval(&sa.iter().map(get).collect::<Vec<_>>());
            let ib = interval(&sb.iter().map(get).collect::<Vec<_>>());
            out.push(Delta {
                variant: variant.clone(),
                metric,
                a: ia,
                b: ib,
                change: (ib.mean - ia.mean) / ia.mean,
                p: welch_p(&ia, &ib),
            });
        }
    }
    out
}

/// The comparison as a table, and as CSV text.
pub fn compare_outputs(deltas: &[Delta]) -> (String, String) {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::ASCII_FULL_CONDENSED);
    t.set_header([
        "variant",
        "metric",
        "A (mean ± 95% CI)",
        "B (mean ± 95% CI)",
        "B vs A",
        "p (Welch)",
    ]);
    let mut csv =
        String::from("variant,metric,a_n,a_mean,a_ci95,b_n,b_mean,b_ci95,change,p_value\n");
    for d in deltas {
        let pct = if d.change.is_finite() {
            format!("{:+.1}%", 100.0 * d.change)
        } else {
            "-".into()
        };
        let p = if d.p.is_finite() {
            format!("{:.3}", d.p)
        } else {
            "-".into()
        };
        t.add_row([
            d.variant.clone(),
            d.metric.to_string(),
            fmt_interval(&d.a),
            fmt_interval(&d.b),
            pct,
            p,
        ]);
        let num = |x: f64| {
            if x.is_finite() {
                format!("{x:.6}")
            } else {
                String::new()
            }
        };
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{},{},{},{}",
            d.variant,
            d.metric,
            d.a.n,
            num(d.a.mean),
            if d.a.n > 1 {
                num(d.a.half)
            } else {
                String::new()
            },
            d.b.n,
            num(d.b.mean),
            if d.b.n > 1 {
                num(d.b.half)
            } else {
                String::new()
            },
            num(d.change),
            num(d.p)
        );
    }
    (t.to_string(), csv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_and_welch_match_textbook_values() {
        // Mean 5, sample sd sqrt(2.5); t(0.975, 4) = 2.7764.
        let i = interval(&[3.0, 4.0, 5.0, 6.0, 7.0]);
        assert!((i.mean - 5.0).abs() < 1e-12);
        assert!((i.half - 2.7764 * 2.5f64.sqrt() / 5f64.sqrt()).abs() < 1e-3);
        assert_eq!(interval(&[2.0]).half, 0.0);
        assert!(interval(&[]).mean.is_nan());
        // Identical samples: p = 1; far apart: p near 0.
        let a = interval(&[1.0, 2.0, 3.0]);
        assert!((welch_p(&a, &a) - 1.0).abs() < 1e-12);
        let b = interval(&[10.0, 11.0, 12.0]);
        assert!(welch_p(&a, &b) < 0.01);
    }
}
