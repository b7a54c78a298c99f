//! `sim calibrate --observed` on real runs (a folder of the runs `sim replay` reads, or one
//! run): the cost terms a replay feels, fitted by replaying the runs under candidate values
//! and setting the simulated requests against the measured ones, with held-out errors.
//!
//! Runs are grouped by the deployment they replay (the catalog model and GPU), and each
//! group gets its own fit: a GPU's kernels reach their own fractions of its peaks on each
//! model's shapes, and a user calibrates the deployment they run. The terms ([`TERMS`]: the GEMMs' compute and weight-streaming
//! efficiencies, the all-reduce's efficiency, the step's and each sequence's CPU overhead,
//! the front end's cost per request) are fitted one at a time in that order, each over a fixed grid whose first
//! candidate is the default, and the sweep repeated until nothing moves (at most
//! [`SWEEPS`]): coordinate descent, reproducible, the first candidate winning ties, so a
//! term the runs cannot feel (the GEMMs' efficiencies where an operator profile prices the
//! steps, the front end where the run's timestamps are the engine's) keeps its default.
//!
//! The score of a fit on some of the requests: per run, the relative errors of its mean
//! TTFT and mean TPOT over those requests; the mean over the runs of their sum of absolute
//! values. Held out two ways:
//! - **by time**: each run's requests, in send order, are cut into k contiguous blocks,
//!   and fold i is fitted on every block but the i-th of every run and judged on those
//!   (a fit never sees the requests it is judged on; every replay still runs them all, as
//!   the engine did);
//! - **by run**, where a deployment has several runs: each run is predicted by the fit on
//!   the others (another load, another day).
//!
//! In: the runs and how to replay them. Out: a [`ReplayedFit`] per deployment: the fit on every
//! request, each fold's, every run's figures under the defaults, in-sample and held out;
//! its calibration file ([`ReplayedFit::toml`], whose `[fit]` gives `sim run` and `sim
//! plan` their bands) and a CSV of every run's figures ([`ReplayedFit::csv`]).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;

use crate::observed::ObservedRun;
use crate::replay::{replay_samples, ReplayError, ReplayOptions, Sample};

/// A fitted term and the values tried (the default, the `[cost]` key left out, comes
/// first).
#[derive(Debug, Clone, Copy)]
pub struct Term {
    /// The `[cost]` key.
    pub key: &'static str,
    /// The values tried after the default.
    pub candidates: &'static [f64],
}

/// The terms, in the order they are fitted.
pub const TERMS: [Term; 6] = [
    // The prefill's GEMMs (compute-bound): a card whose kernels reach its datasheet peak
    // (an RTX 4090's) sits above the default 0.75.
    Term {
        key: "gemm_compute_eff",
        candidates: &[0.55, 0.65, 0.85, 0.95, 1.0],
    },
    // A decode's GEMMs (weight streaming).
    Term {
        key: "gemm_memory_eff",
        candidates: &[0.65, 0.75, 0.9, 0.95, 1.0],
    },
    // Tensor parallelism's all-reduces (runs at TP 1 do not feel it; a run whose link its
    // own description gives keeps that link's).
    Term {
        key: "allreduce_eff",
        candidates: &[0.3, 0.45, 0.6, 0.8, 1.0],
    },
    Term {
        key: "step_overhead_us",
        candidates: &[0.0, 250.0, 500.0, 1000.0, 2000.0, 4000.0],
    },
    Term {
        key: "per_seq_overhead_us",
        candidates: &[0.0, 10.0, 25.0, 50.0, 100.0],
    },
    // Only runs whose latencies the client measured feel it (`sim replay` pins it to 0
    // where the timestamps are the engine's own).
    Term {
        key: "request_overhead_ms",
        candidates: &[0.0, 5.0, 10.0, 20.0, 40.0, 80.0],
    },
];

/// The most sweeps over [`TERMS`].
pub const SWEEPS: usize = 3;

/// A set of fitted terms (a key left out keeps its default).
pub type Fit = BTreeMap<&'static str, f64>;

/// One run to fit to.
#[derive(Debug, Clone)]
pub struct FitRun {
    /// Its name in tables (the run's folder or file, as `sim replay` names it).
    pub name: String,
    /// The run.
    pub run: ObservedRun,
}

/// How the runs are replayed: the replay options every candidate's replay copies (its
/// output folder and calibration file are the candidate's).
#[derive(Debug, Clone)]
pub struct FitOptions {
    /// Replays write their scenarios, traces and runs under this folder (removed when the
    /// fit ends, with or without an error).
    pub scratch: PathBuf,
    /// The replay options (output folder and calibration replaced per candidate).
    pub replay: ReplayOptions,
    /// Folds of the split by time (2 or more).
    pub folds: usize,
    /// The `[cost]` table the fit starts from (a calibration file's; empty: the defaults):
    /// each term's first candidate is its value here, and the files written carry it.
    pub base: toml::Table,
}

/// One run's figures under one fit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figures {
    /// Mean TTFT (ms).
    pub ttft_mean: f64,
    /// Median TTFT (ms).
    pub ttft_p50: f64,
    /// 90th percentile of TTFT (ms).
    pub ttft_p90: f64,
    /// Mean TPOT (ms).
    pub tpot_mean: f64,
    /// Mean end-to-end latency (ms).
    pub e2el_mean: f64,
}

impl Figures {
    /// The figures' names, in [`Figures::values`]' order.
    pub const NAMES: [&'static str; 5] = [
        "ttft_mean_ms",
        "ttft_p50_ms",
        "ttft_p90_ms",
        "tpot_mean_ms",
        "e2el_mean_ms",
    ];

    /// The values, in [`Figures::NAMES`]' order.
    pub fn values(&self) -> [f64; 5] {
        [
            self.ttft_mean,
            self.ttft_p50,
            self.ttft_p90,
            self.tpot_mean,
            self.e2el_mean,
        ]
    }

    fn of(samples: &[Req]) -> Figures {
        let ttft: Vec<f64> = samples.iter().map(|s| s.ttft_ms).collect();
        let tpot: Vec<f64> = samples.iter().filter_map(|s| s.tpot_ms).collect();
        let e2el: Vec<f64> = samples.iter().map(|s| s.e2el_ms).collect();
        Figures {
            ttft_mean: mean(&ttft),
            ttft_p50: analysis::percentile(&ttft, 50.0),
            ttft_p90: analysis::percentile(&ttft, 90.0),
            tpot_mean: mean(&tpot),
            e2el_mean: mean(&e2el),
        }
    }
}

/// One run's figures: measured, and simulated under the defaults, the fit on every request
/// (in-sample), the time folds' fits (each request from the fold that held it out), and
/// the fit on the deployment's other runs.
#[derive(Debug, Clone)]
pub struct RunFigures {
    /// The run's name.
    pub name: String,
    /// Its requests.
    pub requests: usize,
    /// Measured.
    pub measured: Figures,
    /// Simulated with the terms the fit started from (the defaults, or the `--calibration`
    /// file's).
    pub defaults: Figures,
    /// Simulated with the fit on every request (in-sample).
    pub fitted: Figures,
    /// Simulated with each time fold's fit on the requests it held out.
    pub held_out: Figures,
    /// Simulated with the fit on the deployment's other runs (`None`: it has none).
    pub other_runs: Option<Figures>,
}

/// A deployment's fit.
#[derive(Debug, Clone)]
pub struct ReplayedFit {
    /// The catalog model its runs replay.
    pub model: String,
    /// The catalog GPU they replay on.
    pub gpu: String,
    /// The fit on every request of every run.
    pub fit: Fit,
    /// Each time fold's fit.
    pub folds: Vec<Fit>,
    /// Each run's fit on the others (empty with one run).
    pub run_folds: Vec<Fit>,
    /// Each run's figures.
    pub runs: Vec<RunFigures>,
    /// Held-out signed relative errors of mean TTFT and mean TPOT, one per run and time
    /// fold (the fold's fit on the block it held out).
    pub block_errors: Vec<(f64, f64)>,
    /// Replays run (distinct fits x runs).
    pub replays: usize,
    /// The `[cost]` table the fit started from ([`FitOptions::base`]).
    pub base: toml::Table,
}

/// One request as the fit scores it.
#[derive(Debug, Clone, Copy)]
struct Req {
    ttft_ms: f64,
    tpot_ms: Option<f64>,
    e2el_ms: f64,
}

impl From<&Sample> for Req {
    fn from(s: &Sample) -> Req {
        Req {
            ttft_ms: s.ttft_ms,
            tpot_ms: s.tpot_ms,
            e2el_ms: s.e2el_ms,
        }
    }
}

/// A scratch folder, removed when dropped (on success and on every error path alike).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// A fit's simulated requests of every run (`[run][request]`, `None`: not finished).
type Simulated = Vec<Vec<Option<Req>>>;

/// One fit's replays: its memo key, the simulated requests and the measured ones.
type Evaluated = (String, Simulated, Vec<Vec<Req>>);

/// Replays the runs under fits, each fit once.
struct Evaluator<'a> {
    runs: &'a [FitRun],
    opts: &'a FitOptions,
    memo: HashMap<String, std::sync::Arc<Simulated>>,
    /// The measured requests of every run, from the first replay.
    measured: Vec<Vec<Req>>,
    next: AtomicUsize,
}

/// A calibration file's `[cost]` table: `base` with `fit`'s terms over it.
fn cost_table(base: &toml::Table, fit: &Fit) -> Result<String, String> {
    let mut cost = base.clone();
    for (k, v) in fit {
        cost.insert((*k).to_string(), toml::Value::Float(*v));
    }
    let mut root = toml::Table::new();
    root.insert("cost".into(), toml::Value::Table(cost));
    toml::to_string(&root).map_err(|e| format!("[cost]: {e}"))
}

/// A fit's terms as `key = value` lines (the memo's key).
fn cost_lines(fit: &Fit) -> String {
    let mut s = String::new();
    for (k, v) in fit {
        let _ = writeln!(s, "{k} = {v:?}");
    }
    s
}

impl Evaluator<'_> {
    /// Every run replayed under `fit`.
    fn replay(&self, fit: &Fit) -> Result<(Simulated, Vec<Vec<Req>>), ReplayError> {
        let slot = self.next.fetch_add(1, Ordering::Relaxed);
        let dir = self.opts.scratch.join(format!("fit{slot}"));
        // What the candidate's replays write is not kept: only their requests are.
        let _guard = Scratch(dir.clone());
        std::fs::create_dir_all(&dir).map_err(|e| ReplayError::Io {
            path: dir.clone(),
            message: e.to_string(),
        })?;
        let file = dir.join("cost.toml");
        let text = cost_table(&self.opts.base, fit).map_err(|message| ReplayError::Io {
            path: file.clone(),
            message,
        })?;
        std::fs::write(&file, text).map_err(|e| ReplayError::Io {
            path: file.clone(),
            message: e.to_string(),
        })?;
        let mut simulated = Vec::with_capacity(self.runs.len());
        let mut measured = Vec::with_capacity(self.runs.len());
        for (i, r) in self.runs.iter().enumerate() {
            let opts = ReplayOptions {
                out_dir: dir.join(format!("run{i}")),
                calibration: Some(file.clone()),
                ..self.opts.replay.clone()
            };
            let out = replay_samples(&r.run, &opts)?;
            let mut sim = vec![None; out.measured.len()];
            for s in &out.simulated {
                if let Some(slot) = sim.get_mut(s.id) {
                    *slot = Some(Req::from(s));
                }
            }
            simulated.push(sim);
            measured.push(out.measured.iter().map(Req::from).collect());
        }
        Ok((simulated, measured))
    }

    /// Replays the fits not yet replayed (in parallel), and returns every fit's requests.
    fn eval(&mut self, fits: &[Fit]) -> Result<Vec<std::sync::Arc<Simulated>>, ReplayError> {
        let mut todo: Vec<(String, &Fit)> = Vec::new();
        for f in fits {
            let key = cost_lines(f);
            if !self.memo.contains_key(&key) && !todo.iter().any(|(k, _)| *k == key) {
                todo.push((key, f));
            }
        }
        let done: Vec<Result<Evaluated, ReplayError>> = todo
            .par_iter()
            .map(|(key, f)| {
                let (s, m) = self.replay(f)?;
                Ok((key.clone(), s, m))
            })
            .collect();
        for d in done {
            let (key, s, m) = d?;
            if self.measured.is_empty() {
                self.measured = m;
            }
            self.memo.insert(key, std::sync::Arc::new(s));
        }
        Ok(fits
            .iter()
            .map(|f| std::sync::Arc::clone(&self.memo[&cost_lines(f)]))
            .collect())
    }
}

/// Which of a run's requests count: `(run, block)` of each.
type Units<'a> = &'a (dyn Fn(usize, usize) -> bool + Sync);

/// The block (time fold) of request `i` of `n` under `k` folds.
fn block(i: usize, n: usize, k: usize) -> usize {
    i * k / n.max(1)
}

/// Signed relative errors of the mean TTFT and mean TPOT of run `r`'s requests in `units`
/// (`None`: none of them finished in the simulation, or none was measured).
fn run_errors(
    sim: &Simulated,
    measured: &[Vec<Req>],
    r: usize,
    k: usize,
    units: Units,
) -> Option<(f64, f64)> {
    let n = measured[r].len();
    let (mut mt, mut st, mut mp, mut sp) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (i, m) in measured[r].iter().enumerate() {
        if !units(r, block(i, n, k)) {
            continue;
        }
        // A request whose TTFT the run did not record (0) says nothing about the means.
        let Some(s) = sim[r][i].filter(|_| m.ttft_ms > 0.0) else {
            continue;
        };
        mt.push(m.ttft_ms);
        st.push(s.ttft_ms);
        if let (Some(a), Some(b)) = (m.tpot_ms, s.tpot_ms) {
            mp.push(a);
            sp.push(b);
        }
    }
    let (m_ttft, m_tpot) = (mean(&mt), mean(&mp));
    if mt.is_empty() || m_ttft <= 0.0 {
        return None;
    }
    let ttft = mean(&st) / m_ttft - 1.0;
    let tpot = if mp.is_empty() || m_tpot <= 0.0 {
        0.0
    } else {
        mean(&sp) / m_tpot - 1.0
    };
    Some((ttft, tpot))
}

/// The score of a fit's requests on `units`: the mean over the runs of |TTFT error| +
/// |TPOT error| (of their means); runs with no request in `units` do not count.
fn score(sim: &Simulated, measured: &[Vec<Req>], k: usize, units: Units) -> f64 {
    let errs: Vec<f64> = (0..measured.len())
        .filter_map(|r| run_errors(sim, measured, r, k, units))
        .map(|(a, b)| a.abs() + b.abs())
        .collect();
    if errs.is_empty() {
        f64::INFINITY
    } else {
        mean(&errs)
    }
}

/// Coordinate descent over [`TERMS`] on the requests in `units`.
fn descend(ev: &mut Evaluator, k: usize, units: Units) -> Result<Fit, ReplayError> {
    let mut fit = Fit::new();
    for _ in 0..SWEEPS {
        let before = fit.clone();
        for term in TERMS {
            let mut cands = Vec::with_capacity(term.candidates.len() + 1);
            let mut without = fit.clone();
            without.remove(term.key);
            cands.push(without);
            for &v in term.candidates {
                let mut c = fit.clone();
                c.insert(term.key, v);
                cands.push(c);
            }
            let sims = ev.eval(&cands)?;
            let mut best = (f64::INFINITY, 0);
            for (i, s) in sims.iter().enumerate() {
                let e = score(s, &ev.measured, k, units);
                if e < best.0 - 1e-9 {
                    best = (e, i);
                }
            }
            fit = cands.swap_remove(best.1);
        }
        if fit == before {
            break;
        }
    }
    Ok(fit)
}

/// Runs grouped by the deployment they replay: `(catalog model, catalog GPU)`.
pub type Deployments = BTreeMap<(&'static str, &'static str), Vec<FitRun>>;

/// Fits every deployment of `groups` ([`fit_runs`]): its runs replayed on its GPU with
/// `replay`'s other options, its candidates' replays in a folder of its own under `scratch`
/// (removed), `folds` blocks by time, starting from `base`.
pub fn fit_deployments(
    groups: &Deployments,
    scratch: &std::path::Path,
    replay: &ReplayOptions,
    folds: usize,
    base: &toml::Table,
) -> Result<Vec<ReplayedFit>, ReplayError> {
    let mut fits = Vec::with_capacity(groups.len());
    for (&(model, gpu), runs) in groups {
        let opts = FitOptions {
            scratch: scratch.join(format!(".replayed-{model}-{gpu}")),
            replay: ReplayOptions {
                gpu: Some(gpu.to_string()),
                ..replay.clone()
            },
            folds,
            base: base.clone(),
        };
        fits.push(fit_runs((model, gpu), runs, &opts)?);
    }
    Ok(fits)
}

/// Fits one deployment's runs (`(model, gpu)`, the catalog's names, name it in tables and
/// files).
pub fn fit_runs(
    (model, gpu): (&str, &str),
    runs: &[FitRun],
    opts: &FitOptions,
) -> Result<ReplayedFit, ReplayError> {
    let k = opts.folds.max(2);
    let _guard = Scratch(opts.scratch.clone());
    let mut ev = Evaluator {
        runs,
        opts,
        memo: HashMap::new(),
        measured: Vec::new(),
        next: AtomicUsize::new(0),
    };
    let defaults = ev.eval(&[Fit::new()])?.remove(0);
    let fit = descend(&mut ev, k, &|_, _| true)?;
    let mut folds = Vec::with_capacity(k);
    for f in 0..k {
        folds.push(descend(&mut ev, k, &move |_, b| b != f)?);
    }
    let mut run_folds = Vec::new();
    if runs.len() > 1 {
        for r in 0..runs.len() {
            run_folds.push(descend(&mut ev, k, &move |q, _| q != r)?);
        }
    }
    let fitted = ev.eval(std::slice::from_ref(&fit))?.remove(0);
    let fold_sims = ev.eval(&folds)?;
    let run_sims = ev.eval(&run_folds)?;
    let measured = ev.measured.clone();
    let mut figures = Vec::with_capacity(runs.len());
    let mut block_errors = Vec::new();
    for (r, run) in runs.iter().enumerate() {
        let n = measured[r].len();
        let pick = |sim: &Simulated, keep: &dyn Fn(usize) -> bool| -> Vec<Req> {
            (0..n)
                .filter(|&i| keep(i))
                .filter_map(|i| sim[r][i])
                .collect()
        };
        let held: Vec<Req> = (0..n)
            .filter_map(|i| fold_sims[block(i, n, k)][r][i])
            .collect();
        for (f, sim) in fold_sims.iter().enumerate() {
            if let Some(e) = run_errors(sim, &measured, r, k, &move |_, b| b == f) {
                block_errors.push(e);
            }
        }
        figures.push(RunFigures {
            name: run.name.clone(),
            requests: n,
            measured: Figures::of(&measured[r]),
            defaults: Figures::of(&pick(&defaults, &|_| true)),
            fitted: Figures::of(&pick(&fitted, &|_| true)),
            held_out: Figures::of(&held),
            other_runs: run_sims.get(r).map(|s| Figures::of(&pick(s, &|_| true))),
        });
    }
    Ok(ReplayedFit {
        model: model.to_string(),
        gpu: gpu.to_string(),
        fit,
        folds,
        run_folds,
        runs: figures,
        block_errors,
        replays: ev.memo.len() * runs.len(),
        base: opts.base.clone(),
    })
}

/// `fit`'s terms in words (`defaults` when it moves none).
pub fn describe(fit: &Fit) -> String {
    if fit.is_empty() {
        return "defaults".into();
    }
    fit.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn pct(sim: f64, measured: f64) -> f64 {
    if measured == 0.0 {
        0.0
    } else {
        100.0 * (sim / measured - 1.0)
    }
}

impl ReplayedFit {
    /// The deployment in words (`llama-3.1-8b on rtx-4090`).
    pub fn deployment(&self) -> String {
        format!("{} on {}", self.model, self.gpu)
    }

    /// The median over runs of |error| of figure `i` ([`Figures::NAMES`]) under `pick`.
    fn median_abs(&self, i: usize, pick: impl Fn(&RunFigures) -> Option<Figures>) -> Option<f64> {
        let errs: Vec<f64> = self
            .runs
            .iter()
            .filter_map(|r| pick(r).map(|f| pct(f.values()[i], r.measured.values()[i]).abs()))
            .collect();
        (!errs.is_empty()).then(|| analysis::median(&errs))
    }

    /// The fit and every run's figures as a text table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{}: {} run{} replayed ({} replays); fit on every request: {}",
            self.deployment(),
            self.runs.len(),
            if self.runs.len() == 1 { "" } else { "s" },
            self.replays,
            describe(&self.fit)
        );
        for (i, f) in self.folds.iter().enumerate() {
            let _ = writeln!(s, "  time fold {}: {}", i + 1, describe(f));
        }
        for (r, f) in self.runs.iter().zip(&self.run_folds) {
            let _ = writeln!(s, "  without {}: {}", r.name, describe(f));
        }
        // What the fit started from: the defaults, or the `--calibration` file's terms.
        let start = if self.base.is_empty() {
            "defaults"
        } else {
            "calibration"
        };
        let _ = writeln!(
            s,
            "  {:<14} {:>11} {:>20} {:>20} {:>20} {:>20}",
            "figure", "measured", start, "fit (in-sample)", "held out (time)", "held out (runs)"
        );
        for r in &self.runs {
            let _ = writeln!(s, "  {} ({} requests)", r.name, r.requests);
            let m = r.measured.values();
            let cell = |f: Option<Figures>, i: usize| {
                f.map_or("-".to_string(), |f| {
                    let v = f.values()[i];
                    format!("{v:.1} ({:+.1}%)", pct(v, m[i]))
                })
            };
            for (i, name) in Figures::NAMES.iter().enumerate() {
                let _ = writeln!(
                    s,
                    "  {:<14} {:>11.1} {:>20} {:>20} {:>20} {:>20}",
                    name,
                    m[i],
                    cell(Some(r.defaults), i),
                    cell(Some(r.fitted), i),
                    cell(Some(r.held_out), i),
                    cell(r.other_runs, i)
                );
            }
        }
        let summary = |i: usize| {
            let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}%"));
            format!(
                "{start} {}, held out by time {}, by run {}",
                f(self.median_abs(i, |r| Some(r.defaults))),
                f(self.median_abs(i, |r| Some(r.held_out))),
                f(self.median_abs(i, |r| r.other_runs))
            )
        };
        let _ = writeln!(
            s,
            "  median |error| over runs: TTFT mean {}; TPOT mean {}",
            summary(0),
            summary(3)
        );
        s
    }

    /// The calibration file: the fit under `[cost]`, its folds and held-out error
    /// intervals under `[fit]` (what `sim run` and `sim plan` make bands of), the runs and
    /// their errors in the header. `source` is what was given to `--observed`.
    pub fn toml(&self, source: &str) -> Result<String, String> {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# {}: cost terms fitted by `sim calibrate --observed {source}` to replays of {} run{}",
            self.deployment(),
            self.runs.len(),
            if self.runs.len() == 1 { "" } else { "s" }
        );
        let _ = writeln!(
            s,
            "# (coordinate descent over {}; each run's requests cut in send order into {} blocks, each held out in turn).",
            TERMS.map(|t| t.key).join(", "),
            self.folds.len()
        );
        for line in self.table().lines().skip(1) {
            let _ = writeln!(s, "# {}", line.trim_end());
        }
        let _ = writeln!(s, "{}", cost_table(&self.base, &self.fit)?);
        if self.block_errors.is_empty() {
            // No block finished a request: no held-out error to give bands from.
            return Ok(s);
        }
        let q = |v: &[f64], p: f64| analysis::percentile(v, p);
        let ttft: Vec<f64> = self.block_errors.iter().map(|e| e.0).collect();
        let tpot: Vec<f64> = self.block_errors.iter().map(|e| e.1).collect();
        let _ = writeln!(s, "# Each time fold's fit, and the held-out signed errors of each run's blocks' mean TTFT and TPOT: central 50% and 90% intervals.");
        let _ = writeln!(s, "[fit]");
        let _ = writeln!(
            s,
            "source = {:?}",
            format!(
                "sim calibrate --observed {source}: {} by replays of {} run(s) of {}, {}-fold by time",
                TERMS.map(|t| t.key).join(", "),
                self.runs.len(),
                self.deployment(),
                self.folds.len()
            )
        );
        let _ = writeln!(s, "folds = [");
        for f in &self.folds {
            let inner = f
                .iter()
                .map(|(k, v)| format!("{k} = {v:?}"))
                .collect::<Vec<_>>()
                .join(", ");
            let _ = writeln!(s, "  {{ {inner} }},");
        }
        let _ = writeln!(s, "]");
        // Never below -1 (a relative error's floor; the bands divide by 1 + it).
        let band = |v: &[f64], lo: f64, hi: f64| {
            let (a, b) = (q(v, lo).max(-0.99), q(v, hi).max(-0.99));
            format!("[{a:.4}, {:.4}]", b.max(a))
        };
        let _ = writeln!(s, "ttft_error_50 = {}", band(&ttft, 25.0, 75.0));
        let _ = writeln!(s, "ttft_error_90 = {}", band(&ttft, 5.0, 95.0));
        let _ = writeln!(s, "tpot_error_50 = {}", band(&tpot, 25.0, 75.0));
        let _ = writeln!(s, "tpot_error_90 = {}", band(&tpot, 5.0, 95.0));
        Ok(s)
    }

    /// Every run's figures: `run,figure,measured,defaults,fitted,held_out,other_runs`.
    pub fn csv(&self) -> String {
        let mut s = String::from("run,figure,measured,defaults,fitted,held_out,other_runs\n");
        for r in &self.runs {
            for (i, name) in Figures::NAMES.iter().enumerate() {
                let _ = writeln!(
                    s,
                    "{},{name},{:.3},{:.3},{:.3},{:.3},{}",
                    r.name,
                    r.measured.values()[i],
                    r.defaults.values()[i],
                    r.fitted.values()[i],
                    r.held_out.values()[i],
                    r.other_runs
                        .map_or(String::new(), |f| format!("{:.3}", f.values()[i]))
                );
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cut_requests_in_send_order() {
        let blocks: Vec<usize> = (0..10).map(|i| block(i, 10, 5)).collect();
        assert_eq!(blocks, vec![0, 0, 1, 1, 2, 2, 3, 3, 4, 4]);
        assert_eq!(block(6, 7, 3), 2);
        assert_eq!(block(0, 1, 5), 0);
    }

    #[test]
    fn the_score_is_the_mean_of_each_runs_absolute_errors() {
        let req = |t: f64, p: f64| Req {
            ttft_ms: t,
            tpot_ms: Some(p),
            e2el_ms: t + p,
        };
        let measured = vec![
            vec![req(100.0, 10.0), req(100.0, 10.0)],
            vec![req(50.0, 5.0)],
        ];
        let sim: Simulated = vec![
            vec![Some(req(110.0, 9.0)), Some(req(110.0, 9.0))],
            vec![Some(req(40.0, 5.0))],
        ];
        // Run 0: +10% TTFT, -10% TPOT; run 1: -20% TTFT, 0% TPOT.
        let s = score(&sim, &measured, 2, &|_, _| true);
        assert!((s - 0.2).abs() < 1e-12, "{s}");
        // Only run 0's second block (its second request).
        let s = score(&sim, &measured, 2, &|r, b| r == 0 && b == 1);
        assert!((s - 0.2).abs() < 1e-12, "{s}");
        // Nothing in the units: no score.
        assert!(score(&sim, &measured, 2, &|_, _| false).is_infinite());
        // A request the simulation did not finish is left out of both sides.
        let partial: Simulated = vec![vec![Some(req(110.0, 9.0)), None], vec![None]];
        let e = run_errors(&partial, &measured, 0, 2, &|_, _| true).expect("errors");
        assert!(
            (e.0 - 0.1).abs() < 1e-12 && (e.1 + 0.1).abs() < 1e-12,
            "{e:?}"
        );
        assert!(run_errors(&partial, &measured, 1, 2, &|_, _| true).is_none());
    }

    #[test]
    fn a_fits_cost_lines_are_a_cost_table() {
        let mut fit = Fit::new();
        fit.insert("step_overhead_us", 500.0);
        fit.insert("gemm_compute_eff", 0.95);
        let t: toml::Table = cost_table(&toml::Table::new(), &fit)
            .expect("cost table")
            .parse()
            .expect("toml");
        let p: crate::cost_model::CostParams =
            toml::Value::Table(t["cost"].as_table().expect("table").clone())
                .try_into()
                .expect("cost params");
        assert_eq!(p.gemm_compute_eff, 0.95);
        assert_eq!(p.step_overhead_us, Some(500.0));
        assert_eq!(describe(&Fit::new()), "defaults");
        // Over a base file's table: the fit's terms replace the base's, the rest stay.
        let base: toml::Table = "step_overhead_us = 600.0\neager_layer_us = 900.0\n[by_gpu.h200]\nfp8_compute_eff = 0.8\n"
            .parse()
            .expect("toml");
        let t: toml::Table = cost_table(&base, &fit)
            .expect("cost table")
            .parse()
            .expect("toml");
        let p: crate::cost_model::CostParams =
            toml::Value::Table(t["cost"].as_table().expect("table").clone())
                .try_into()
                .expect("cost params");
        assert_eq!(p.step_overhead_us, Some(500.0));
        assert_eq!(p.eager_layer_us, Some(900.0));
        assert_eq!(p.gemm_compute_eff, 0.95);
        assert_eq!(p.by_gpu["h200"].fp8_compute_eff, Some(0.8));
    }
}
