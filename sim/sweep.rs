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
    let variants: Vec<String> = scenario
        .variants
        .iter()
        .filter(|v| opts.only.is_empty() || opts.only.contains(&v.name))
        .map(|v| v.name.clone())
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
    // Folder names of the points; if two values print alike, numbered folders instead.
    let mut dirs: Vec<String> = points
        .iter()
        .map(|p| {
            let values: Vec<(String, String)> =
                p.iter().map(|(k, x)| (k.clone(), label(x))).collect();
            point_dir(&values)
        })
        .collect();
    let mut seen = dirs.clone();
    seen.sort();
    seen.dedup();
    if seen.len() < dirs.len() {
        dirs = (0..points.len()).map(|i| format!("point-{i:04}")).collect();
    }
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
        let name = &variants[v];
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
        let dir: Option<PathBuf> = opts.out_dir.as_ref().map(|d| d.join(&dirs[p]).join(name));
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
            // The point's own configuration: a sweep may switch speculation on or off.
            speculative: variant.scheduler.speculative.is_some(),
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
    // Copying into a shard's own folder would truncate its files (or recurse).
    std::fs::create_dir_all(out).map_err(|e| io_err(out, e))?;
    let out_abs = out.canonicalize().map_err(|e| io_err(out, e))?;
    for dir in dirs {
        let d = dir.canonicalize().map_err(|e| io_err(dir, e))?;
        if out_abs == d || out_abs.starts_with(&d) {
            return Err(io_err(
                out,
                format!(
                    "the merged results must go to a new folder, not into the shard folder {}",
                    dir.display()
                ),
            ));
        }
    }
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
    // Checked: now copy the runs and write the joined table.
    for dir in dirs {
        copy_runs(dir, out, true)?;
    }
    let path = out.join("sweep.csv");
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
/// swept key's values (in numeric order where they are numbers), columns the second's (if
/// any), one map per value of any further keys; along each column the first key's values
/// where the TPOT speedup crosses 1 are reported (interpolated linearly).
pub fn speedup_map(keys: &[String], runs: &[SweepRun]) -> Option<String> {
    let baseline = runs.iter().find(|r| !r.speculative)?.variant.clone();
    let mut spec_variants: Vec<String> = Vec::new();
    for r in runs.iter().filter(|r| r.speculative) {
        if !spec_variants.contains(&r.variant) {
            spec_variants.push(r.variant.clone());
        }
    }
    if spec_variants.is_empty() {
        return None;
    }
    let values_of = |i: usize| -> Vec<String> {
        let mut v: Vec<String> = Vec::new();
        for r in runs {
            if let Some((_, x)) = r.values.get(i) {
                if !v.contains(x) {
                    v.push(x.clone());
                }
            }
        }
        // Numbers in numeric order, the rest as first seen.
        if v.iter().all(|x| x.parse::<f64>().is_ok()) {
            v.sort_by(|a, b| {
                let (a, b) = (
                    a.parse::<f64>().unwrap_or(0.0),
                    b.parse::<f64>().unwrap_or(0.0),
                );
                a.total_cmp(&b)
            });
        }
        v
    };
    let rows = values_of(0);
    let cols = if keys.len() > 1 {
        values_of(1)
    } else {
        vec![String::new()]
    };
    // Further keys: one map per combination of their values.
    let mut rests: Vec<Vec<String>> = Vec::new();
    for r in runs {
        let rest: Vec<String> = r.values.iter().skip(2).map(|(_, v)| v.clone()).collect();
        if !rests.contains(&rest) {
            rests.push(rest);
        }
    }
    let find = |variant: &str, row: &str, col: &str, rest: &[String]| -> Option<&Summary> {
        runs.iter()
            .find(|r| {
                r.variant == variant
                    && r.values.first().is_none_or(|(_, v)| v == row)
                    && (keys.len() < 2 || r.values.get(1).is_some_and(|(_, v)| v == col))
                    && r.values.iter().skip(2).map(|(_, v)| v).eq(rest.iter())
            })
            .map(|r| &r.summary)
    };
    let row_key = keys.first().cloned().unwrap_or_else(|| "point".into());
    let mut out = String::new();
    for rest in &rests {
        let at_rest = keys
            .iter()
            .skip(2)
            .zip(rest)
            .map(|(k, v)| format!("{k} = {v}"))
            .collect::<Vec<_>>()
            .join(", ");
        for v in &spec_variants {
            out.push_str(&format!(
                "speedup of `{v}` over `{baseline}` (TPOT speedup / throughput speedup){}; rows: {row_key}{}\n",
                if at_rest.is_empty() { String::new() } else { format!(" at {at_rest}") },
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
                    let cell = match (find(&baseline, r, c, rest), find(v, r, c, rest)) {
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
            for (ci, c) in cols.iter().enumerate() {
                let series: Vec<(f64, f64)> = rows
                    .iter()
                    .zip(&tpot)
                    .filter_map(|(r, t)| Some((r.parse::<f64>().ok()?, t[ci]?)))
                    .collect();
                if series.is_empty() {
                    continue;
                }
                let at = if c.is_empty() {
                    String::new()
                } else {
                    format!(" at {} = {c}", keys.get(1).cloned().unwrap_or_default())
                };
                out.push_str(&crossings(&series, &row_key, &at));
            }
        }
    }
    Some(out)
}

/// Where a speedup series (in x order) crosses 1, as report lines.
fn crossings(series: &[(f64, f64)], key: &str, at: &str) -> String {
    let mut out = String::new();
    for w in series.windows(2) {
        let ((x0, y0), (x1, y1)) = (w[0], w[1]);
        if (y0 >= 1.0) != (y1 >= 1.0) {
            let x = x0 + (y0 - 1.0) / (y0 - y1) * (x1 - x0);
            let which = if y1 < 1.0 {
                "falls below"
            } else {
                "rises above"
            };
            out.push_str(&format!(
                "  crossover{at}: TPOT speedup {which} 1 at {key} = {x:.3}\n"
            ));
        }
    }
    if out.is_empty() {
        let all_faster = series.iter().all(|p| p.1 >= 1.0);
        out.push_str(&format!(
            "  crossover{at}: none; {} at every {key} swept\n",
            if all_faster { "faster" } else { "slower" }
        ));
    }
    out
}

/// Reads a `sweep.csv` back: its swept keys and its runs (their summaries hold the
/// numbers the speedup map needs: mean TPOT and output throughput).
pub fn read_sweep_csv(path: &Path) -> Result<(Vec<String>, Vec<SweepRun>), SimError> {
    let mut r = csv::Reader::from_path(path).map_err(|e| io_err(path, e))?;
    let h = r.headers().map_err(|e| io_err(path, e))?.clone();
    let col = |name: &str| {
        h.iter()
            .position(|c| c == name)
            .ok_or_else(|| io_err(path, format!("no column `{name}`")))
    };
    let (vcol, scol) = (col("variant")?, col("speculative")?);
    let (tcol, ocol) = (col("mean_tpot_ms")?, col("output_throughput")?);
    let keys: Vec<String> = h
        .iter()
        .skip(2)
        .take(vcol.saturating_sub(2))
        .map(str::to_owned)
        .collect();
    let mut runs = Vec::new();
    for (line, rec) in r.records().enumerate() {
        let rec = rec.map_err(|e| io_err(path, e))?;
        let num = |i: usize| -> Result<f64, SimError> {
            rec.get(i).unwrap_or("").parse::<f64>().map_err(|_| {
                io_err(
                    path,
                    format!("row {}: column {} is not a number", line + 2, i + 1),
                )
            })
        };
        runs.push(SweepRun {
            job: num(0)? as usize,
            point: num(1)? as usize,
            values: keys
                .iter()
                .enumerate()
                .map(|(i, k)| (k.clone(), rec.get(2 + i).unwrap_or("").to_owned()))
                .collect(),
            variant: rec.get(vcol).unwrap_or("").to_owned(),
            speculative: rec.get(scol) == Some("true"),
            summary: Summary {
                mean_tpot_ms: num(tcol)?,
                output_throughput: num(ocol)?,
                ..Summary::default()
            },
        });
    }
    Ok((keys, runs))
}

/// After a whole sweep or a merge: the speedup map from `dir/sweep.csv`, written to
/// `dir/speedup.txt` (and returned) when variants speculate beside a baseline.
pub fn finish_sweep(dir: &Path) -> Result<Option<String>, SimError> {
    let (keys, runs) = read_sweep_csv(&dir.join("sweep.csv"))?;
    let map = speedup_map(&keys, &runs);
    if let Some(text) = &map {
        write_speedup(dir, text)?;
    }
    Ok(map)
}

/// Writes the speedup map (as printed) to `speedup.txt`.
pub fn write_speedup(dir: &Path, text: &str) -> Result<(), SimError> {
    let path = dir.join("speedup.txt");
    std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    std::fs::write(&path, text).map_err(|e| io_err(&path, e))
}
