//! The report of a sweep: per variant (and value of the keys after the first) throughput,
//! goodput and p50/p99 TTFT and TPOT against the first swept key, with the SLO lines, the
//! saturation knees when the first key is a rate, the speculative speedup, and links to the
//! points' reports; from `sweep.csv` and the points' folders.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::{bad, esc, page, SIZE};
use crate::error::AnalysisError;
use crate::plots::{svg, Chart, Series};
use crate::summary::read_summary_json;

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

impl SweepRow {
    /// The value of the first swept key, when it is a number.
    fn x(&self) -> Option<f64> {
        self.values.first().and_then(|v| v.parse::<f64>().ok())
    }
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
    let (scenario, keys, rows) = read_sweep(dir)?;
    let x_key = keys.first().cloned().unwrap_or_default();
    let is_rate = x_key.ends_with("rate");
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
        panel(&mut b, label, group, &x_key, is_rate, slo, &mut knees);
    }
    speedup_chart(&mut b, &rows, &keys, &x_key, is_rate);
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

/// `sweep.csv` of a sweep folder: the scenario's name, the swept keys and the rows.
fn read_sweep(dir: &Path) -> Result<(String, Vec<String>, Vec<SweepRow>), AnalysisError> {
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
    Ok((scenario, keys, rows))
}

/// One panel of the sweep report (one value of the keys after the first, `label`): per
/// variant along the first key, throughput (with the offered load and the knees when the
/// key is a rate), goodput, and p50/p99 TTFT and TPOT with the SLO lines.
fn panel(
    b: &mut String,
    label: &str,
    group: &[&SweepRow],
    x_key: &str,
    is_rate: bool,
    slo: (Option<f64>, Option<f64>),
    knees: &mut Vec<String>,
) {
    let x_key = x_key.to_string();
    let x_of = SweepRow::x;
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

/// Speculative decoding: TPOT speedup over the baseline (the first variant that does not
/// speculate) along the first key, one line per speculating variant and value of the
/// second key.
fn speedup_chart(b: &mut String, rows: &[SweepRow], keys: &[String], x_key: &str, is_rate: bool) {
    let x_key = x_key.to_string();
    let x_of = SweepRow::x;
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
