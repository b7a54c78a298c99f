//! `report.html`: a self-contained page per run (SVG inline, no script, no network) built
//! from the files a run wrote, so `sim report DIR` can rebuild it at any time.
//!
//! A run folder holds one folder per variant (`summary.json`, `requests.csv`,
//! `steps.csv`, `plan.json`, `warnings.txt`) and, when `sim run` wrote it, `scenario.toml`
//! and `comparison.csv` (whose order the report follows). A sweep folder holds
//! `sweep.csv` and one run folder per point; its report plots the sweep (throughput,
//! latency and goodput against the first swept key, SLO lines and saturation knees) and
//! links the points' reports.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::error::AnalysisError;
use crate::plots::{cdf, downsample, svg, Chart, Series};
use crate::summary::{read_summary_json, Summary};

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

/// The comparison table's rows: `(label, getter)`.
type Row = (&'static str, fn(&Summary) -> String);

const COMPARISON: [Row; 16] = [
    ("completed", |s| s.completed.to_string()),
    ("rejected", |s| s.num_rejected.to_string()),
    ("request throughput (req/s)", |s| {
        format!("{:.3}", s.request_throughput)
    }),
    ("output throughput (tok/s)", |s| {
        format!("{:.1}", s.output_throughput)
    }),
    ("goodput (req/s)", |s| {
        s.request_goodput.map_or("-".into(), |g| format!("{g:.3}"))
    }),
    ("mean / p99 TTFT (ms)", |s| {
        format!("{:.1} / {:.1}", s.mean_ttft_ms, s.p99_ttft_ms)
    }),
    ("mean / p99 TPOT (ms)", |s| {
        format!("{:.2} / {:.2}", s.mean_tpot_ms, s.p99_tpot_ms)
    }),
    ("mean / p99 ITL (ms)", |s| {
        format!("{:.2} / {:.2}", s.mean_itl_ms, s.p99_itl_ms)
    }),
    ("mean / p99 E2EL (ms)", |s| {
        format!("{:.1} / {:.1}", s.mean_e2el_ms, s.p99_e2el_ms)
    }),
    ("preemptions (swapped)", |s| {
        format!("{} ({})", s.num_preemptions, s.num_swap_preemptions)
    }),
    ("prefix cache hit rate", |s| {
        format!("{:.1}%", 100.0 * s.prefix_cache_hit_rate)
    }),
    ("mean / max KV usage", |s| {
        format!(
            "{:.1}% / {:.1}%",
            100.0 * s.mean_kv_usage,
            100.0 * s.max_kv_usage
        )
    }),
    ("mean batch (seqs / tokens)", |s| {
        format!("{:.1} / {:.1}", s.mean_batch_size, s.mean_batched_tokens)
    }),
    ("spec acceptance (rate / mean length)", |s| {
        s.speculative.as_ref().map_or("-".into(), |x| {
            format!(
                "{:.1}% / {:.2}",
                100.0 * x.acceptance_rate,
                x.mean_acceptance_length
            )
        })
    }),
    ("leaked blocks", |s| s.leaked_blocks.to_string()),
    ("steps", |s| s.num_steps.to_string()),
];

const SIZE: (u32, u32) = (540, 340);

/// The run's report page (see the module docs).
pub fn run_report(dir: &Path, variants: &[VariantData]) -> String {
    let scenario = variants
        .first()
        .map(|v| v.summary.scenario.clone())
        .unwrap_or_default();
    let mut b = String::new();
    let _ = writeln!(b, "<h1>{}</h1>", esc(&scenario));
    if let Ok(text) = std::fs::read_to_string(dir.join("scenario.toml")) {
        if let Some(desc) = text
            .lines()
            .find_map(|l| l.strip_prefix("description = "))
            .map(|d| d.trim_matches('"'))
        {
            let _ = writeln!(b, "<p>{}</p>", esc(desc));
        }
    }
    // Comparison.
    b.push_str("<h2>Comparison</h2>\n");
    let mut header = vec!["metric".to_string()];
    header.extend(variants.iter().map(|v| v.name.clone()));
    let rows: Vec<Vec<String>> = COMPARISON
        .iter()
        .map(|(label, get)| {
            let mut r = vec![label.to_string()];
            r.extend(variants.iter().map(|v| get(&v.summary)));
            r
        })
        .collect();
    b.push_str(&table(&header, &rows));
    // Warnings.
    let warnings: Vec<&String> = variants.iter().flat_map(|v| &v.warnings).collect();
    b.push_str("<h2>Warnings</h2>\n");
    if warnings.is_empty() {
        b.push_str("<p>None: no leak, rejection, preemption storm or adjusted trace row.</p>\n");
    } else {
        b.push_str("<ul>\n");
        for w in warnings {
            let _ = writeln!(b, "<li class=\"warn\">{}</li>", esc(w));
        }
        b.push_str("</ul>\n");
    }
    // Latency CDFs.
    b.push_str("<h2>Latency distributions</h2>\n<div class=\"plots\">\n");
    let slo = variants
        .first()
        .map(|v| v.summary.slo.clone())
        .unwrap_or_default();
    type Metric = (&'static str, fn(&VariantData) -> &Vec<f64>, Option<f64>);
    let metrics: [Metric; 3] = [
        ("TTFT", |v| &v.ttft_ms, slo.ttft_ms),
        ("TPOT", |v| &v.tpot_ms, slo.tpot_ms),
        ("E2EL", |v| &v.e2el_ms, slo.e2el_ms),
    ];
    for (name, get, bound) in metrics {
        let chart = Chart {
            title: format!("{name} CDF"),
            x_label: format!("{name} (ms)"),
            y_label: "fraction of requests".into(),
            series: variants
                .iter()
                .map(|v| Series {
                    name: v.name.clone(),
                    points: cdf(get(v), 400),
                })
                .collect(),
            hlines: Vec::new(),
            marks: bound
                .map(|x| vec![(format!("SLO {x} ms"), x, 0.0)])
                .unwrap_or_default(),
            log_x: false,
        };
        // Latencies over orders of magnitude read better on a log axis.
        let (lo, hi) = chart
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .fold((f64::INFINITY, 0.0f64), |(a, b), x| (a.min(x), b.max(x)));
        let chart = Chart {
            log_x: lo > 0.0 && hi / lo > 30.0,
            ..chart
        };
        b.push_str(&svg(&chart, SIZE));
    }
    b.push_str("</div>\n");
    // Over time.
    b.push_str("<h2>Over time</h2>\n<div class=\"plots\">\n");
    type Over = (&'static str, &'static str, usize);
    let over: [Over; 4] = [
        ("KV cache usage", "fraction of blocks", 1),
        ("Running requests", "sequences", 2),
        ("Waiting requests", "requests", 3),
        ("Batch size", "tokens per step", 4),
    ];
    for (title, y, i) in over {
        let chart = Chart {
            title: title.into(),
            x_label: "time (s)".into(),
            y_label: y.into(),
            series: variants
                .iter()
                .map(|v| Series {
                    name: v.name.clone(),
                    points: downsample(
                        &v.steps.iter().map(|s| (s[0], s[i])).collect::<Vec<_>>(),
                        800,
                    ),
                })
                .collect(),
            ..Chart::default()
        };
        b.push_str(&svg(&chart, SIZE));
    }
    if variants.iter().any(|v| !v.hit_rate.is_empty()) {
        let chart = Chart {
            title: "Prefix cache hit rate (cumulative)".into(),
            x_label: "arrival time (s)".into(),
            y_label: "cached / prompt tokens".into(),
            series: variants
                .iter()
                .map(|v| Series {
                    name: v.name.clone(),
                    points: downsample(&v.hit_rate, 800),
                })
                .collect(),
            ..Chart::default()
        };
        b.push_str(&svg(&chart, SIZE));
    }
    if variants.iter().any(|v| v.summary.num_preemptions > 0) {
        let chart = Chart {
            title: "Preemptions (cumulative)".into(),
            x_label: "time (s)".into(),
            y_label: "preemptions".into(),
            series: variants
                .iter()
                .map(|v| Series {
                    name: v.name.clone(),
                    points: downsample(
                        &v.steps.iter().map(|s| (s[0], s[5])).collect::<Vec<_>>(),
                        800,
                    ),
                })
                .collect(),
            ..Chart::default()
        };
        b.push_str(&svg(&chart, SIZE));
    }
    b.push_str("</div>\n");
    // Memory plans.
    b.push_str("<h2>Memory plan</h2>\n");
    let keys = [
        ("weight_bytes", "weights (GB)", 1e-9),
        ("activation_bytes", "activations (GB)", 1e-9),
        ("kv_budget_bytes", "KV budget (GB)", 1e-9),
        ("kv_bytes_per_token", "KV bytes per token", 1.0),
        ("num_blocks", "KV blocks", 1.0),
        ("pool_tokens", "KV tokens", 1.0),
        (
            "max_concurrency_at_max_len",
            "concurrency at max length",
            1.0,
        ),
    ];
    let rows: Vec<Vec<String>> = keys
        .iter()
        .map(|(k, label, scale)| {
            let mut r = vec![label.to_string()];
            r.extend(variants.iter().map(|v| {
                v.plan
                    .as_ref()
                    .and_then(|p| p.get("memory")?.get(*k)?.as_f64())
                    .map_or("-".into(), |x| {
                        let x = x * scale;
                        if x.fract() == 0.0 && x.abs() < 1e15 {
                            format!("{x:.0}")
                        } else {
                            format!("{x:.2}")
                        }
                    })
            }));
            r
        })
        .collect();
    b.push_str(&table(&header, &rows));
    // The scenario.
    if let Ok(text) = std::fs::read_to_string(dir.join("scenario.toml")) {
        let _ = writeln!(b, "<h2>Scenario</h2>\n<pre>{}</pre>", esc(&text));
    }
    page(&format!("{scenario}: report"), &b)
}

/// Writes `dir/report.html` for a run folder, and each variant's `metrics.prom`
/// ([`crate::prometheus`]); returns the report's path.
pub fn write_run_report(dir: &Path) -> Result<PathBuf, AnalysisError> {
    let variants = read_run(dir)?;
    for v in &variants {
        let path = dir.join(&v.name).join("metrics.prom");
        std::fs::write(&path, crate::prometheus::exposition(v))
            .map_err(|e| AnalysisError::io(&path, e))?;
    }
    let html = run_report(dir, &variants);
    let path = dir.join("report.html");
    std::fs::write(&path, html).map_err(|e| AnalysisError::io(&path, e))?;
    Ok(path)
}

/// One row of `sweep.csv`, as the sweep report needs it.
#[derive(Debug, Clone)]
struct SweepRow {
    values: Vec<String>,
    variant: String,
    speculative: bool,
    mean_tpot: f64,
    throughput: f64,
    goodput: Option<f64>,
    ttft: [f64; 2],
    tpot: [f64; 2],
}

/// The saturation knee of a rate sweep: the highest offered rate served at 95% or more
/// (the engine keeps up), among `(rate, achieved)` in rate order, if the next rate is not.
pub fn knee(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let keeps_up = |&(r, x): &(f64, f64)| x >= 0.95 * r;
    let i = points.iter().rposition(keeps_up)?;
    (i + 1 < points.len()).then_some(points[i])
}

/// The sweep report page: per variant (and value of the other swept keys) throughput,
/// goodput and p50/p99 TTFT and TPOT against the first swept key, with the SLO lines, the
/// saturation knees when the first key is a rate, the speedup map, and links to the
/// points' reports.
pub fn sweep_report(dir: &Path) -> Result<String, AnalysisError> {
    let path = dir.join("sweep.csv");
    let mut r = csv::Reader::from_path(&path).map_err(|e| AnalysisError::Csv {
        path: path.clone(),
        source: e,
    })?;
    let header = r
        .headers()
        .map_err(|e| AnalysisError::Csv {
            path: path.clone(),
            source: e,
        })?
        .clone();
    let pos = |c: &str| {
        header
            .iter()
            .position(|h| h == c)
            .ok_or_else(|| bad(&path, format!("no column `{c}`")))
    };
    let (vcol, scol) = (pos("variant")?, pos("scenario")?);
    // Swept keys sit between `point` and `variant`.
    let keys: Vec<String> = header
        .iter()
        .skip(2)
        .take(vcol.checked_sub(2).ok_or_else(|| {
            bad(
                &path,
                "the `variant` column must follow `job`, `point` and the swept keys".into(),
            )
        })?)
        .map(str::to_owned)
        .collect();
    let num = |rec: &csv::StringRecord, c: &str| -> Result<f64, AnalysisError> {
        let i = pos(c)?;
        rec.get(i)
            .unwrap_or("")
            .parse::<f64>()
            .map_err(|_| bad(&path, format!("`{c}` is not a number")))
    };
    let mut rows = Vec::new();
    let mut scenario = String::new();
    for rec in r.records() {
        let rec = rec.map_err(|e| AnalysisError::Csv {
            path: path.clone(),
            source: e,
        })?;
        scenario = rec.get(scol).unwrap_or("").to_owned();
        let goodput = rec
            .get(pos("request_goodput")?)
            .and_then(|g| g.parse::<f64>().ok());
        rows.push(SweepRow {
            values: (2..vcol)
                .map(|i| rec.get(i).unwrap_or("").to_owned())
                .collect(),
            variant: rec.get(vcol).unwrap_or("").to_owned(),
            speculative: rec.get(pos("speculative")?) == Some("true"),
            mean_tpot: num(&rec, "mean_tpot_ms")?,
            throughput: num(&rec, "request_throughput")?,
            goodput,
            ttft: [num(&rec, "median_ttft_ms")?, num(&rec, "p99_ttft_ms")?],
            tpot: [num(&rec, "median_tpot_ms")?, num(&rec, "p99_tpot_ms")?],
        });
    }
    let x_key = keys.first().cloned().unwrap_or_default();
    let is_rate = x_key.ends_with("rate");
    let x_of = |row: &SweepRow| row.values.first().and_then(|v| v.parse::<f64>().ok());
    // One panel of charts per value of the keys after the first; in each, one series per
    // variant along the first key.
    let mut panels: Vec<(String, Vec<&SweepRow>)> = Vec::new();
    for row in &rows {
        let label = keys
            .iter()
            .zip(&row.values)
            .skip(1)
            .map(|(k, v)| format!("{k} = {v}"))
            .collect::<Vec<_>>()
            .join(", ");
        match panels.iter_mut().find(|(l, _)| *l == label) {
            Some((_, g)) => g.push(row),
            None => panels.push((label, vec![row])),
        }
    }
    let slo = variants_slo(dir);
    let mut b = String::new();
    let _ = writeln!(b, "<h1>{}: sweep</h1>", esc(&scenario));
    let _ = writeln!(
        b,
        "<p>{} runs; swept: {}. Charts run along {}{}.</p>",
        rows.len(),
        esc(&keys.join(", ")),
        esc(&x_key),
        if is_rate {
            " (log scale); a triangle marks each variant's saturation knee, the highest offered rate it still serves at 95% or more"
        } else {
            ""
        }
    );
    let mut knees = Vec::new();
    for (label, group) in &panels {
        let mut variants: Vec<&str> = Vec::new();
        for r in group {
            if !variants.contains(&r.variant.as_str()) {
                variants.push(&r.variant);
            }
        }
        let series = |get: &dyn Fn(&SweepRow) -> Option<f64>, suffix: &str| -> Vec<Series> {
            variants
                .iter()
                .map(|v| {
                    let mut pts: Vec<(f64, f64)> = group
                        .iter()
                        .filter(|r| r.variant == *v)
                        .filter_map(|r| Some((x_of(r)?, get(r)?)))
                        .collect();
                    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                    Series {
                        name: format!("{v}{suffix}"),
                        points: pts,
                    }
                })
                .collect()
        };
        if !label.is_empty() {
            let _ = writeln!(b, "<h2>{}</h2>", esc(label));
        }
        b.push_str("<div class=\"plots\">\n");
        let throughput = series(&|r| Some(r.throughput), "");
        let mut marks = Vec::new();
        if is_rate {
            for s in &throughput {
                if let Some((x, y)) = knee(&s.points) {
                    marks.push((String::new(), x, y));
                    let at = if label.is_empty() {
                        String::new()
                    } else {
                        format!(" ({label})")
                    };
                    knees.push(format!("{}{at}: {x}", s.name));
                }
            }
        }
        let mut offered = Vec::new();
        if is_rate {
            let mut xs: Vec<f64> = group.iter().filter_map(|r| x_of(r)).collect();
            xs.sort_by(f64::total_cmp);
            xs.dedup();
            offered.push(Series {
                name: "offered load".into(),
                points: xs.iter().map(|&x| (x, x)).collect(),
            });
        }
        let both = |get: fn(&SweepRow) -> [f64; 2]| -> Vec<Series> {
            series(&|r| Some(get(r)[0]), " p50")
                .into_iter()
                .chain(series(&|r| Some(get(r)[1]), " p99"))
                .collect()
        };
        let mut charts = vec![
            Chart {
                title: "Throughput vs offered load".into(),
                x_label: x_key.clone(),
                y_label: "completed requests/s".into(),
                series: throughput.into_iter().chain(offered).collect(),
                marks,
                log_x: is_rate,
                ..Chart::default()
            },
            Chart {
                title: "TTFT p50 and p99".into(),
                x_label: x_key.clone(),
                y_label: "ms".into(),
                series: both(|r| r.ttft),
                hlines: slo
                    .0
                    .map(|x| vec![(format!("SLO {x} ms"), x)])
                    .unwrap_or_default(),
                log_x: is_rate,
                ..Chart::default()
            },
            Chart {
                title: "TPOT p50 and p99".into(),
                x_label: x_key.clone(),
                y_label: "ms".into(),
                series: both(|r| r.tpot),
                hlines: slo
                    .1
                    .map(|x| vec![(format!("SLO {x} ms"), x)])
                    .unwrap_or_default(),
                log_x: is_rate,
                ..Chart::default()
            },
        ];
        if group.iter().any(|r| r.goodput.is_some()) {
            charts.insert(
                1,
                Chart {
                    title: "Goodput (requests meeting every SLO)".into(),
                    x_label: x_key.clone(),
                    y_label: "requests/s".into(),
                    series: series(&|r| r.goodput, ""),
                    log_x: is_rate,
                    ..Chart::default()
                },
            );
        }
        for c in &charts {
            b.push_str(&svg(c, SIZE));
        }
        b.push_str("</div>\n");
    }
    // Speculative decoding: TPOT speedup over the baseline (the first variant that does
    // not speculate) along the first key, one line per speculating variant and value of
    // the second key.
    if let Some(base) = rows
        .iter()
        .find(|r| !r.speculative)
        .map(|r| r.variant.clone())
    {
        let mut series: Vec<Series> = Vec::new();
        for r in rows.iter().filter(|r| r.speculative) {
            let rest = keys
                .iter()
                .zip(&r.values)
                .skip(1)
                .map(|(k, v)| format!(" {}={v}", k.rsplit('.').next().unwrap_or(k)))
                .collect::<String>();
            let name = format!("{}{rest}", r.variant);
            let Some(b) = rows
                .iter()
                .find(|x| x.variant == base && x.values == r.values)
            else {
                continue;
            };
            let Some(x) = x_of(r) else { continue };
            let point = (x, b.mean_tpot / r.mean_tpot);
            match series.iter_mut().find(|s| s.name == name) {
                Some(s) => s.points.push(point),
                None => series.push(Series {
                    name,
                    points: vec![point],
                }),
            }
        }
        for s in &mut series {
            s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        if !series.is_empty() {
            let _ = writeln!(
                b,
                "<h2>Speculative decoding: TPOT speedup over `{}`</h2>",
                esc(&base)
            );
            b.push_str(&svg(
                &Chart {
                    title: format!("TPOT speedup over {base} (above 1: speculation pays)"),
                    x_label: x_key.clone(),
                    y_label: "baseline TPOT / variant TPOT".into(),
                    series,
                    hlines: vec![("1x".into(), 1.0)],
                    log_x: is_rate,
                    ..Chart::default()
                },
                (820, 420),
            ));
        }
    }
    if !knees.is_empty() {
        b.push_str("<h2>Saturation knees</h2>\n<ul>\n");
        for k in &knees {
            let _ = writeln!(b, "<li>{}</li>", esc(k));
        }
        b.push_str("</ul>\n");
    }
    if let Ok(text) = std::fs::read_to_string(dir.join("speedup.txt")) {
        let _ = writeln!(
            b,
            "<h2>Speculative decoding: speedup map</h2>\n<pre>{}</pre>",
            esc(&text)
        );
    }
    // Links to the points' reports.
    let mut points: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| AnalysisError::io(dir, e))?
        .filter_map(Result::ok)
        .filter(|e| e.path().join("report.html").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    points.sort();
    if !points.is_empty() {
        b.push_str("<h2>Points</h2>\n<ul>\n");
        for p in points {
            let _ = writeln!(
                b,
                "<li><a href=\"{}/report.html\">{}</a></li>",
                esc(&p),
                esc(&p)
            );
        }
        b.push_str("</ul>\n");
    }
    Ok(page(&format!("{scenario}: sweep"), &b))
}

/// The SLO bounds (TTFT, TPOT) of the first run found under a sweep folder.
fn variants_slo(dir: &Path) -> (Option<f64>, Option<f64>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (None, None);
    };
    let mut dirs: Vec<PathBuf> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
    dirs.sort();
    for d in dirs.iter().filter(|d| d.is_dir()) {
        let Ok(vs) = std::fs::read_dir(d) else {
            continue;
        };
        let mut vs: Vec<PathBuf> = vs.filter_map(Result::ok).map(|e| e.path()).collect();
        vs.sort();
        for v in vs {
            if let Ok(s) = read_summary_json(&v.join("summary.json")) {
                return (s.slo.ttft_ms, s.slo.tpot_ms);
            }
        }
    }
    (None, None)
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
