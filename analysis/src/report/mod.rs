//! `report.html`: a self-contained page per run (SVG inline, no script, no network) built
//! from the files a run wrote, so `sim report DIR` can rebuild it at any time.
//!
//! A run folder holds one folder per variant (`summary.json`, `requests.csv`,
//! `steps.csv`, `plan.json`, `warnings.txt`) and, when `sim run` wrote it, `scenario.toml`
//! and `comparison.csv` (whose order the report follows). A sweep folder holds
//! `sweep.csv` and one run folder per point; its report plots the sweep (throughput,
//! latency and goodput against the first swept key, SLO lines and saturation knees) and
//! links the points' reports.

mod fleet;
mod run;
mod sweep;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

pub use fleet::FleetData;
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
    /// preemptions)`, averaged over chunks of consecutive steps to at most 800 rows (as the
    /// charts draw them).
    pub steps: Vec<[f64; 6]>,
    /// The last step's row, as it was.
    pub last_step: Option<[f64; 6]>,
    /// `plan.json`, when present.
    pub plan: Option<serde_json::Value>,
    /// `warnings.txt` lines.
    pub warnings: Vec<String>,
    /// Cumulative prefix-cache hit rate (cached / prompt tokens) by arrival: `(arrival s,
    /// rate)`, empty when nothing hit.
    pub hit_rate: Vec<(f64, f64)>,
    /// A fleet's own files (`None`: one engine).
    pub fleet: Option<fleet::FleetData>,
}

fn bad(path: &Path, msg: String) -> AnalysisError {
    AnalysisError::Invalid {
        path: path.to_path_buf(),
        message: msg,
    }
}

/// Reads `path` as CSV, one row at a time: for each row the values of `columns` (by header
/// name, empty cells as NaN) go to `each`. A missing file has no rows. Returns the rows read.
fn csv_columns<const N: usize>(
    path: &Path,
    columns: [&str; N],
    mut each: impl FnMut([f64; N]),
) -> Result<u64, AnalysisError> {
    if !path.exists() {
        return Ok(0);
    }
    let csv_err = |e| AnalysisError::Csv {
        path: path.to_path_buf(),
        source: e,
    };
    let mut r = csv::Reader::from_path(path).map_err(csv_err)?;
    let header = r.headers().map_err(csv_err)?.clone();
    let mut idx = [0usize; N];
    for (slot, c) in idx.iter_mut().zip(columns) {
        *slot = header
            .iter()
            .position(|h| h == c)
            .ok_or_else(|| bad(path, format!("no column `{c}`")))?;
    }
    let mut rec = csv::StringRecord::new();
    let mut line = 1u64;
    while r.read_record(&mut rec).map_err(csv_err)? {
        line += 1;
        let mut row = [f64::NAN; N];
        for ((v, &i), c) in row.iter_mut().zip(&idx).zip(columns) {
            match rec.get(i).unwrap_or("") {
                "" => {}
                text => {
                    *v = text.parse::<f64>().map_err(|_| {
                        bad(
                            path,
                            format!("line {line}: `{c}` is `{text}`, not a number"),
                        )
                    })?
                }
            }
        }
        each(row);
    }
    Ok(line - 1)
}

/// A step as the charts read it (see [`VariantData::steps`]).
type StepRow = [f64; 6];

/// Points kept per over-time chart ([`crate::plots::downsample`]'s bound).
const MAX_POINTS: usize = 800;

/// A variant's `steps.csv` as chart rows `(start s, KV usage, running, waiting, batched
/// tokens, cumulative preemptions)`, averaged over chunks as [`crate::plots::downsample`] averages them
/// (at most [`MAX_POINTS`] rows), and the last step's row. Two passes over the file, so
/// that memory does not grow with the run's steps.
fn read_steps(path: &Path) -> Result<(Vec<StepRow>, Option<StepRow>), AnalysisError> {
    let columns = [
        "start_s",
        "kv_usage",
        "num_running",
        "num_waiting",
        "num_batched_tokens",
        "num_preempted",
    ];
    let n = csv_columns(path, columns, |_| {})? as usize;
    let per = if n <= MAX_POINTS {
        1
    } else {
        n.div_ceil(MAX_POINTS)
    };
    let mut out = Vec::with_capacity(n.min(MAX_POINTS));
    let mut chunk: Vec<[f64; 6]> = Vec::with_capacity(per);
    let mut preempted = 0.0;
    let mut last = None;
    // The same sums, in the same order, as `downsample` over the whole column.
    let mean =
        |chunk: &[[f64; 6]], j: usize| chunk.iter().map(|r| r[j]).sum::<f64>() / chunk.len() as f64;
    let flush = |chunk: &mut Vec<[f64; 6]>, out: &mut Vec<[f64; 6]>| {
        if chunk.len() == 1 {
            out.push(chunk[0]);
        } else if !chunk.is_empty() {
            out.push(std::array::from_fn(|j| mean(chunk, j)));
        }
        chunk.clear();
    };
    csv_columns(path, columns, |r| {
        preempted += r[5];
        let row = [r[0], r[1], r[2], r[3], r[4], preempted];
        last = Some(row);
        chunk.push(row);
        if chunk.len() == per {
            flush(&mut chunk, &mut out);
        }
    })?;
    flush(&mut chunk, &mut out);
    Ok((out, last))
}

/// Reads a variant's folder.
pub fn read_variant(dir: &Path) -> Result<VariantData, AnalysisError> {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let summary = read_summary_json(&dir.join("summary.json"))?;
    let mut req: Vec<[f64; 6]> = Vec::new();
    csv_columns(
        &dir.join("requests.csv"),
        [
            "ttft_ms",
            "tpot_ms",
            "e2el_ms",
            "arrival_s",
            "prompt_len",
            "cached_tokens",
        ],
        |r| req.push(r),
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
    let (steps, last_step) = read_steps(&dir.join("steps.csv"))?;
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
        last_step,
        plan,
        warnings,
        hit_rate,
        fleet: fleet::read_fleet(dir)?,
    })
}

/// The variants of a run folder, as folder names: those its `comparison.csv` lists (the
/// last run into the folder), in that order, when it has one; else every sub-folder with a
/// `summary.json`, by name. Folders an earlier run left there are not part of the run.
pub fn run_variants(dir: &Path) -> Result<Vec<String>, AnalysisError> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| AnalysisError::io(dir, e))?
        .filter_map(Result::ok)
        .filter(|e| e.path().join("summary.json").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let order: Option<Vec<String>> = csv::Reader::from_path(dir.join("comparison.csv"))
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
        });
    if let Some(order) = order {
        names.retain(|n| order.contains(n));
        names.sort_by_key(|n| order.iter().position(|o| o == n).unwrap_or(usize::MAX));
    }
    Ok(names)
}

/// The variants of a run folder ([`run_variants`]), read.
pub fn read_run(dir: &Path) -> Result<Vec<VariantData>, AnalysisError> {
    run_variants(dir)?
        .iter()
        .map(|n| read_variant(&dir.join(n)))
        .collect()
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
