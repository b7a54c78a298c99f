//! `report.html`: a self-contained page per run (SVG inline, no script, no network) built
//! from the files a run wrote, so `sim report DIR` can rebuild it at any time.
//!
//! A run folder holds one folder per variant (`summary.json`, `requests.csv`,
//! `steps.csv`, `plan.json`, `warnings.txt`) and, when `sim run` wrote it, `scenario.toml`
//! and `comparison.csv` (whose order the report follows). A sweep folder holds
//! `sweep.csv` and one run folder per point; its report plots the sweep (throughput,
//! latency and goodput against the first swept key, SLO lines and saturation knees) and
//! links the points' reports.

mod run;
mod sweep;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

pub use run::{run_report, write_run_report};
pub use sweep::{knee, sweep_report};

use crate::error::AnalysisError;
use crate::summary::{read_summary_json, Summary};

/// Size of one chart, pixels.
const SIZE: (u32, u32) = (540, 340);

/// One variant's results, as read back from its folder.
#[derive(Debug, Clone)]
pub struct VariantData {
    /// Variant name (its folder's name).
    pub name: String,
    /// `summary.json`.
    pub summary: Summary,
    /// Completed requests' TTFT, TPOT (outputs longer than a token) and E2EL, ms.
    pub ttft_ms: Vec<f64>,
    /// TPOT, ms.
    pub tpot_ms: Vec<f64>,
    /// E2EL, ms.
    pub e2el_ms: Vec<f64>,
    /// Per step: `(start s, KV usage, running, waiting, batched tokens, cumulative
    /// preemptions)`.
    pub steps: Vec<[f64; 6]>,
    /// `plan.json`, when present.
    pub plan: Option<serde_json::Value>,
    /// `warnings.txt` lines.
    pub warnings: Vec<String>,
    /// Cumulative prefix-cache hit rate (cached / prompt tokens) by arrival: `(arrival s,
    /// rate)`, empty when nothing hit.
    pub hit_rate: Vec<(f64, f64)>,
}

fn bad(path: &Path, msg: String) -> AnalysisError {
    AnalysisError::io(
        path,
        std::io::Error::new(std::io::ErrorKind::InvalidData, msg),
    )
}

/// Reads `path` as CSV: for each row the values of `columns` (by header name), empty
/// cells as NaN. A missing file gives no rows.
fn csv_columns(path: &Path, columns: &[&str]) -> Result<Vec<Vec<f64>>, AnalysisError> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let mut r = csv::Reader::from_path(path).map_err(|e| AnalysisError::Csv {
        path: path.to_path_buf(),
        source: e,
    })?;
    let header = r
        .headers()
        .map_err(|e| AnalysisError::Csv {
            path: path.to_path_buf(),
            source: e,
        })?
        .clone();
    let idx: Vec<usize> = columns
        .iter()
        .map(|c| {
            header
                .iter()
                .position(|h| h == *c)
                .ok_or_else(|| bad(path, format!("no column `{c}`")))
        })
        .collect::<Result<_, _>>()?;
    let mut rows = Vec::new();
    for (line, rec) in r.records().enumerate() {
        let rec = rec.map_err(|e| AnalysisError::Csv {
            path: path.to_path_buf(),
            source: e,
        })?;
        let row = idx
            .iter()
            .zip(columns)
            .map(|(&i, c)| match rec.get(i).unwrap_or("") {
                "" => Ok(f64::NAN),
                v => v.parse::<f64>().map_err(|_| {
                    bad(
                        path,
                        format!("line {}: `{c}` is `{v}`, not a number", line + 2),
                    )
                }),
            })
            .collect::<Result<Vec<f64>, _>>()?;
        rows.push(row);
    }
    Ok(rows)
}

/// Reads a variant's folder.
pub fn read_variant(dir: &Path) -> Result<VariantData, AnalysisError> {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let summary = read_summary_json(&dir.join("summary.json"))?;
    let req = csv_columns(
        &dir.join("requests.csv"),
        &[
            "ttft_ms",
            "tpot_ms",
            "e2el_ms",
            "arrival_s",
            "prompt_len",
            "cached_tokens",
        ],
    )?;
    let mut by_arrival: Vec<(f64, f64, f64)> = req
        .iter()
        .filter(|r| r[3].is_finite() && r[4].is_finite())
        .map(|r| (r[3], r[4], if r[5].is_finite() { r[5] } else { 0.0 }))
        .collect();
    by_arrival.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut prompt, mut cached) = (0.0, 0.0);
    let mut hit_rate: Vec<(f64, f64)> = by_arrival
        .iter()
        .map(|&(t, p, c)| {
            prompt += p;
            cached += c;
            (t, if prompt > 0.0 { cached / prompt } else { 0.0 })
        })
        .collect();
    if cached == 0.0 {
        hit_rate.clear();
    }
    let col =
        |i: usize| -> Vec<f64> { req.iter().map(|r| r[i]).filter(|v| v.is_finite()).collect() };
    let raw = csv_columns(
        &dir.join("steps.csv"),
        &[
            "start_s",
            "kv_usage",
            "num_running",
            "num_waiting",
            "num_batched_tokens",
            "num_preempted",
        ],
    )?;
    let mut preempted = 0.0;
    let steps = raw
        .iter()
        .map(|r| {
            preempted += r[5];
            [r[0], r[1], r[2], r[3], r[4], preempted]
        })
        .collect();
    let plan = match std::fs::read_to_string(dir.join("plan.json")) {
        Ok(t) => serde_json::from_str(&t).ok(),
        Err(_) => None,
    };
    let warnings = std::fs::read_to_string(dir.join("warnings.txt"))
        .map(|t| t.lines().map(str::to_owned).collect())
        .unwrap_or_default();
    Ok(VariantData {
        name,
        ttft_ms: col(0),
        tpot_ms: col(1),
        e2el_ms: col(2),
        summary,
        steps,
        plan,
        warnings,
        hit_rate,
    })
}

/// The variants of a run folder: sub-folders with a `summary.json`, in `comparison.csv`'s
/// order when it exists, else by name.
pub fn read_run(dir: &Path) -> Result<Vec<VariantData>, AnalysisError> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| AnalysisError::io(dir, e))?
        .filter_map(Result::ok)
        .filter(|e| e.path().join("summary.json").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let order: Vec<String> = csv::Reader::from_path(dir.join("comparison.csv"))
        .ok()
        .and_then(|mut r| {
            let h = r.headers().ok()?.clone();
            let i = h.iter().position(|c| c == "variant")?;
            Some(
                r.records()
                    .filter_map(Result::ok)
                    .filter_map(|rec| rec.get(i).map(str::to_owned))
                    .collect(),
            )
        })
        .unwrap_or_default();
    names.sort_by_key(|n| order.iter().position(|o| o == n).unwrap_or(usize::MAX));
    names.iter().map(|n| read_variant(&dir.join(n))).collect()
}

/// Escapes text for HTML.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const STYLE: &str = "body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}\
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;\
text-align:right}th:first-child,td:first-child{text-align:left}pre{background:#f6f6f6;\
padding:1em;overflow:auto}.plots{display:flex;flex-wrap:wrap;gap:8px}.warn{color:#a00}";

fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{STYLE}</style></head>\n<body>\n{body}</body></html>\n",
        esc(title)
    )
}

/// An HTML table: header cells and rows.
fn table(header: &[String], rows: &[Vec<String>]) -> String {
    let mut t = String::from("<table><tr>");
    for h in header {
        let _ = write!(t, "<th>{}</th>", esc(h));
    }
    t.push_str("</tr>\n");
    for r in rows {
        t.push_str("<tr>");
        for c in r {
            let _ = write!(t, "<td>{}</td>", esc(c));
        }
        t.push_str("</tr>\n");
    }
    t.push_str("</table>\n");
    t
}

/// Writes the reports of a folder: for a sweep (`sweep.csv`), every point's report and
/// the sweep's; otherwise the run's. Returns the top report's path.
pub fn write_reports(dir: &Path) -> Result<PathBuf, AnalysisError> {
    if !dir.join("sweep.csv").exists() {
        return write_run_report(dir);
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| AnalysisError::io(dir, e))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    entries.sort();
    for p in entries {
        let has_runs = std::fs::read_dir(&p)
            .map(|mut d| d.any(|e| e.is_ok_and(|e| e.path().join("summary.json").exists())))
            .unwrap_or(false);
        if has_runs {
            write_run_report(&p)?;
        }
    }
    let html = sweep_report(dir)?;
    let path = dir.join("report.html");
    std::fs::write(&path, html).map_err(|e| AnalysisError::io(&path, e))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_knee_is_the_last_rate_served() {
        let pts = [(1.0, 1.0), (2.0, 1.98), (4.0, 3.9), (8.0, 5.0), (16.0, 5.1)];
        assert_eq!(knee(&pts), Some((4.0, 3.9)));
        // Never saturated, or saturated from the start: no knee.
        assert_eq!(knee(&pts[..3]), None);
        assert_eq!(knee(&[(8.0, 5.0), (16.0, 5.1)]), None);
        assert_eq!(esc("<a&\"b\">"), "&lt;a&amp;&quot;b&quot;&gt;");
    }
}
