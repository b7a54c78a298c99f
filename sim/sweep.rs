//! Sweeps: every point of a scenario's `[sweep]` (the combinations of the swept keys'
//! values) crossed with its variants, run in parallel, each into
//! `<out>/<point>/<variant>/`, with one row per run in `sweep.csv`; `--shard i/N` runs
//! every N-th run, and [`merge`] joins shards into the result set of an unsharded run.
//! A sweep whose variants speculate beside a baseline that does not also gets the
//! speculative-decoding speedup map ([`speedup_map`]).

use std::path::{Path, PathBuf};

use analysis::Summary;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rayon::prelude::*;

use crate::run::{run_variant, BackendKind, RunOptions};
use crate::scenario::{Scenario, ScenarioError};
use crate::SimError;

/// One run of a sweep: a point, a variant and its summary.
#[derive(Debug, Clone)]
pub struct SweepRun {
    /// Index of the run in the whole sweep (points major, variants minor).
    pub job: usize,
    /// Index of the point.
    pub point: usize,
    /// The swept keys' values at the point, as written in TOML.
    pub values: Vec<(String, String)>,
    /// Variant name.
    pub variant: String,
    /// Whether the variant speculates.
    pub speculative: bool,
    /// The run's summary.
    pub summary: Summary,
}

/// `i/N`: run the jobs whose index is `i` modulo `N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// This shard, from 0.
    pub index: usize,
    /// Shards in all.
    pub count: usize,
}

impl std::str::FromStr for Shard {
    type Err = String;
    fn from_str(s: &str) -> Result<Shard, String> {
        let (i, n) = s
            .split_once('/')
            .ok_or_else(|| format!("`{s}`: expected i/N, e.g. 0/4"))?;
        let index: usize = i
            .trim()
            .parse()
            .map_err(|_| format!("`{s}`: i is not a number"))?;
        let count: usize = n
            .trim()
            .parse()
            .map_err(|_| format!("`{s}`: N is not a number"))?;
        if count == 0 || index >= count {
            return Err(format!("`{s}`: need 0 <= i < N"));
        }
        Ok(Shard { index, count })
    }
}

/// A TOML value as a short label (strings unquoted).
fn label(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The folder name of a point: `key=value` of each swept key (last path segment),
/// joined by `,`; characters outside `[A-Za-z0-9._=,-]` become `_`.
fn point_dir(values: &[(String, String)]) -> String {
    if values.is_empty() {
        return "base".into();
    }
    let raw: Vec<String> = values
        .iter()
        .map(|(k, v)| format!("{}={v}", k.rsplit('.').next().unwrap_or(k)))
        .collect();
    raw.join(",")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._=,-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Runs the sweep (or one shard of it) and writes `sweep.csv` (or
/// `sweep.shard-I-of-N.csv`) to `opts.out_dir`.
pub fn run_sweep(
    scenario: &Scenario,
    opts: &RunOptions,
    shard: Option<Shard>,
) -> Result<Vec<SweepRun>, SimError> {
    let points = scenario.sweep_points();
    let variants: Vec<(String, bool)> = scenario
        .variants
        .iter()
        .filter(|v| opts.only.is_empty() || opts.only.contains(&v.name))
        .map(|v| (v.name.clone(), v.scheduler.speculative.is_some()))
        .collect();
    if variants.is_empty() {
        return Err(SimError::Scenario(ScenarioError {
            file: scenario.path.display().to_string(),
            msg: format!("no variant named {:?}", opts.only),
        }));
    }
    // Each point resolved once (errors name the point).
    let resolved: Vec<Scenario> = points
        .iter()
        .map(|p| scenario.at_point(p))
        .collect::<Result<_, _>>()?;
    let jobs: Vec<(usize, usize, usize)> = (0..points.len())
        .flat_map(|p| (0..variants.len()).map(move |v| (p, v)))
        .enumerate()
        .map(|(j, (p, v))| (j, p, v))
        .filter(|(j, _, _)| shard.is_none_or(|s| j % s.count == s.index))
        .collect();
    let bar = if opts.progress {
        ProgressBar::new(jobs.len() as u64)
    } else {
        ProgressBar::with_draw_target(Some(jobs.len() as u64), ProgressDrawTarget::hidden())
    };
    bar.set_style(
        ProgressStyle::with_template("sweep [{bar:40}] {pos}/{len} runs ({eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let hidden = ProgressBar::hidden();
    let job = |&(j, p, v): &(usize, usize, usize)| -> Result<SweepRun, SimError> {
        let point = &resolved[p];
        let (name, speculative) = &variants[v];
        let values: Vec<(String, String)> = points[p]
            .iter()
            .map(|(k, x)| (k.clone(), label(x)))
            .collect();
        let mut variant = point
            .variants
            .iter()
            .find(|x| &x.name == name)
            .cloned()
            .ok_or_else(|| SimError::Run {
                variant: name.clone(),
                source: Box::new(crate::driver::DriverError::Engine(
                    engine::EngineError::Mailbox("variant missing at a sweep point".into()),
                )),
            })?;
        if opts.requests.is_some() {
            variant.config.workload.num_requests = opts.requests;
        }
        let dir: Option<PathBuf> = opts
            .out_dir
            .as_ref()
            .map(|d| d.join(point_dir(&values)).join(name));
        let r = run_variant(
            point,
            &variant,
            opts.backend,
            opts.driver,
            dir.as_deref(),
            &hidden,
            &|| {},
        )?;
        bar.inc(1);
        Ok(SweepRun {
            job: j,
            point: p,
            values,
            variant: name.clone(),
            speculative: *speculative,
            summary: r.summary,
        })
    };
    let parallel = opts.parallel && opts.backend == BackendKind::Model;
    let runs: Vec<Result<SweepRun, SimError>> = if parallel {
        jobs.par_iter().map(job).collect()
    } else {
        jobs.iter().map(job).collect()
    };
    bar.finish_and_clear();
    let runs = runs.into_iter().collect::<Result<Vec<_>, _>>()?;
    if let Some(dir) = &opts.out_dir {
        let name = match shard {
            Some(s) => format!("sweep.shard-{}-of-{}.csv", s.index, s.count),
            None => "sweep.csv".into(),
        };
        write_sweep_csv(&dir.join(name), &scenario.sweep_keys(), &runs)?;
    }
    Ok(runs)
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> SimError {
    SimError::Io {
        path: path.display().to_string(),
        source: std::io::Error::other(e.to_string()),
    }
}

/// `sweep.csv`: `job, point, <swept keys>, variant, speculative`, then every scalar
/// field of the summary.
fn write_sweep_csv(path: &Path, keys: &[String], runs: &[SweepRun]) -> Result<(), SimError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| io_err(parent, e))?;
    }
    let mut w = csv::Writer::from_path(path).map_err(|e| io_err(path, e))?;
    let fields = Summary::default().scalar_fields();
    let mut header: Vec<String> = vec!["job".into(), "point".into()];
    header.extend(keys.iter().cloned());
    header.extend(["variant".to_string(), "speculative".to_string()]);
    header.extend(fields.iter().map(|(k, _)| k.clone()));
    w.write_record(&header).map_err(|e| io_err(path, e))?;
    for r in runs {
        let mut row = vec![r.job.to_string(), r.point.to_string()];
        row.extend(r.values.iter().map(|(_, v)| v.clone()));
        row.extend([r.variant.clone(), r.speculative.to_string()]);
        row.extend(r.summary.scalar_fields().into_iter().map(|(_, v)| v));
        w.write_record(&row).map_err(|e| io_err(path, e))?;
    }
    w.flush().map_err(|e| io_err(path, e))
}

/// Joins the sweep CSVs of shard folders (`sweep.csv` or `sweep.shard-*.csv` in each) into
/// `out/sweep.csv`, rows in job order, and copies each shard's run folders into `out`.
/// Fails on a job seen twice, a gap in the job numbers, or headers that differ. Returns
/// the number of runs.
pub fn merge(dirs: &[PathBuf], out: &Path) -> Result<usize, SimError> {
    let mut header: Option<csv::StringRecord> = None;
    let mut rows: Vec<(usize, csv::StringRecord)> = Vec::new();
    for dir in dirs {
        let entries = std::fs::read_dir(dir).map_err(|e| io_err(dir, e))?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("sweep") && n.ends_with(".csv"))
            })
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(io_err(dir, "no sweep.csv or sweep.shard-*.csv here"));
        }
        for f in files {
            let mut r = csv::Reader::from_path(&f).map_err(|e| io_err(&f, e))?;
            let h = r.headers().map_err(|e| io_err(&f, e))?.clone();
            match &header {
                Some(x) if *x != h => {
                    return Err(io_err(&f, "its columns differ from the other shards'"))
                }
                Some(_) => {}
                None => header = Some(h),
            }
            for (line, rec) in r.records().enumerate() {
                let rec = rec.map_err(|e| io_err(&f, e))?;
                let job: usize = rec.get(0).and_then(|j| j.parse().ok()).ok_or_else(|| {
                    io_err(
                        &f,
                        format!("row {}: the job column is not a number", line + 2),
                    )
                })?;
                rows.push((job, rec));
            }
        }
        copy_runs(dir, out, true)?;
    }
    rows.sort_by_key(|(j, _)| *j);
    for (i, (j, _)) in rows.iter().enumerate() {
        if *j != i {
            return Err(io_err(
                out,
                if *j < i {
                    format!("job {j} appears twice among the shards")
                } else {
                    format!("job {i} is missing: not every shard was given")
                },
            ));
        }
    }
    let path = out.join("sweep.csv");
    std::fs::create_dir_all(out).map_err(|e| io_err(out, e))?;
    let mut w = csv::Writer::from_path(&path).map_err(|e| io_err(&path, e))?;
    if let Some(h) = &header {
        w.write_record(h).map_err(|e| io_err(&path, e))?;
    }
    for (_, r) in &rows {
        w.write_record(r).map_err(|e| io_err(&path, e))?;
    }
    w.flush().map_err(|e| io_err(&path, e))?;
    Ok(rows.len())
}

/// Copies a shard's folder into `out`: its run folders and files, but not its own
/// sweep CSVs and speedup map at the top.
fn copy_runs(from: &Path, out: &Path, top: bool) -> Result<(), SimError> {
    for e in std::fs::read_dir(from).map_err(|e| io_err(from, e))? {
        let e = e.map_err(|e| io_err(from, e))?;
        let (p, name) = (e.path(), e.file_name());
        let n = name.to_string_lossy();
        if p.is_dir() {
            copy_runs(&p, &out.join(&name), false)?;
        } else if !(top && ((n.starts_with("sweep") && n.ends_with(".csv")) || n == "speedup.txt"))
        {
            std::fs::create_dir_all(out).map_err(|e| io_err(out, e))?;
            std::fs::copy(&p, out.join(&name)).map_err(|e| io_err(&p, e))?;
        }
    }
    Ok(())
}

/// The speculative-decoding speedup map of a sweep: for each speculating variant and
/// point, mean TPOT of the baseline (the first variant that does not speculate) over the
/// variant's, and the variant's output throughput over the baseline's. Rows are the first
/// swept key's values, columns the second's (if any); each column's crossover (the first
/// key's value where the TPOT speedup falls through 1, interpolated linearly) is reported.
pub fn speedup_map(scenario: &Scenario, runs: &[SweepRun]) -> Option<String> {
    let baseline = runs.iter().find(|r| !r.speculative)?.variant.clone();
    let spec_variants: Vec<String> = {
        let mut v: Vec<String> = runs
            .iter()
            .filter(|r| r.speculative)
            .map(|r| r.variant.clone())
            .collect();
        v.dedup();
        let mut seen = Vec::new();
        for x in v {
            if !seen.contains(&x) {
                seen.push(x);
            }
        }
        seen
    };
    if spec_variants.is_empty() {
        return None;
    }
    let keys = scenario.sweep_keys();
    let values_of = |i: usize| -> Vec<String> {
        let mut v: Vec<String> = Vec::new();
        for r in runs {
            if let Some((_, x)) = r.values.get(i) {
                if !v.contains(x) {
                    v.push(x.clone());
                }
            }
        }
        v
    };
    let rows = values_of(0);
    let cols = if keys.len() > 1 {
        values_of(1)
    } else {
        vec![String::new()]
    };
    let find = |variant: &str, row: &str, col: &str| -> Option<&Summary> {
        runs.iter()
            .find(|r| {
                r.variant == variant
                    && r.values.first().is_none_or(|(_, v)| v == row)
                    && (keys.len() < 2 || r.values.get(1).is_some_and(|(_, v)| v == col))
            })
            .map(|r| &r.summary)
    };
    let mut out = String::new();
    let row_key = keys.first().cloned().unwrap_or_else(|| "point".into());
    for v in &spec_variants {
        out.push_str(&format!(
            "speedup of `{v}` over `{baseline}` (TPOT speedup / throughput speedup); rows: {row_key}{}\n",
            keys.get(1).map(|k| format!(", columns: {k}")).unwrap_or_default()
        ));
        let mut table = comfy_table::Table::new();
        table.load_preset(comfy_table::presets::ASCII_FULL_CONDENSED);
        let mut header = vec![row_key.clone()];
        header.extend(cols.iter().map(|c| {
            if c.is_empty() {
                "speedup".into()
            } else {
                c.clone()
            }
        }));
        table.set_header(header);
        let mut tpot: Vec<Vec<Option<f64>>> = Vec::new();
        for r in &rows {
            let mut line = vec![r.clone()];
            let mut t_row = Vec::new();
            for c in &cols {
                let cell = match (find(&baseline, r, c), find(v, r, c)) {
                    (Some(b), Some(s)) => {
                        let t = b.mean_tpot_ms / s.mean_tpot_ms;
                        let x = s.output_throughput / b.output_throughput;
                        t_row.push(t.is_finite().then_some(t));
                        format!("{t:.2}x / {x:.2}x")
                    }
                    _ => {
                        t_row.push(None);
                        "-".into()
                    }
                };
                line.push(cell);
            }
            tpot.push(t_row);
            table.add_row(line);
        }
        out.push_str(&table.to_string());
        out.push('\n');
        // Crossovers along the rows, per column.
        for (ci, c) in cols.iter().enumerate() {
            let series: Vec<(f64, f64)> = rows
                .iter()
                .zip(&tpot)
                .filter_map(|(r, t)| Some((r.parse::<f64>().ok()?, t[ci]?)))
                .collect();
            let at = if c.is_empty() {
                String::new()
            } else {
                format!(" at {} = {c}", keys.get(1).cloned().unwrap_or_default())
            };
            let cross = series
                .windows(2)
                .find(|w| w[0].1 >= 1.0 && w[1].1 < 1.0)
                .map(|w| {
                    let ((x0, y0), (x1, y1)) = (w[0], w[1]);
                    x0 + (y0 - 1.0) / (y0 - y1) * (x1 - x0)
                });
            let line = match (cross, series.first(), series.last()) {
                (Some(x), _, _) => {
                    format!("  crossover{at}: TPOT speedup falls below 1 at {row_key} = {x:.3}\n")
                }
                (None, Some(f), _) if f.1 < 1.0 => {
                    format!("  crossover{at}: slower at every {row_key} swept\n")
                }
                (None, _, Some(_)) => {
                    format!("  crossover{at}: faster at every {row_key} swept\n")
                }
                _ => String::new(),
            };
            out.push_str(&line);
        }
    }
    Some(out)
}

/// Writes the speedup map (as printed) to `speedup.txt`.
pub fn write_speedup(dir: &Path, text: &str) -> Result<(), SimError> {
    let path = dir.join("speedup.txt");
    std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    std::fs::write(&path, text).map_err(|e| io_err(&path, e))
}
