//! The founding articles' claims, tested: one scenario per claim in `scenarios/claims/`
//! and one evaluator per claim here, named alike (`kv_cache.toml` is judged by
//! `kv_cache.rs`).
//!
//! In: a claims folder (or one claim's scenario). Each evaluator reads its scenario's
//! variants by name, runs them (or only resolves their memory plans), and returns
//! [`ClaimRow`]s: the claim, the article's figure, the simulated figure, a [`Verdict`]
//! and the reason. The scenarios are ordinary ones, so a user can change the GPU, the
//! model or the workload and judge the claim again on their own setup. Out: the rows, a
//! printed table ([`table`]), `claims.csv` and `claims.md`, and each claim's runs under
//! `<out>/<claim>/` as `sim run` writes them.
//!
//! Where a real runtime can show a claim on this machine, `scenarios/claims/cpu/` holds the
//! same claim on a small GGUF model, judged by the evaluators of [`CPU_EVALUATORS`] from
//! measured (wall-clock) runs of the CPU runtime (`sim claims --backend cpu --model F`).

mod batching;
mod capacity;
mod checklist;
mod frameworks;
mod kv_cache;
mod paged_attention;
mod parallelism;
mod quantization;
mod speculative;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use analysis::Summary;

use crate::driver::DriverKind;
use crate::run::{run_scenario, BackendKind, RunOptions};
use crate::scenario::{Scenario, ScenarioError, Variant};
use crate::sweep::{run_sweep, SweepRun};
use crate::SimError;

/// Whether the simulation bears a claim out.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The simulated figure is within the article's.
    Holds,
    /// It holds under the stated condition only.
    HoldsOnlyWhen(String),
    /// The simulated figure contradicts it.
    DoesNotHold,
}

impl Verdict {
    /// [`Verdict::Holds`] when `holds`, else [`Verdict::DoesNotHold`].
    pub fn holds_if(holds: bool) -> Verdict {
        if holds {
            Verdict::Holds
        } else {
            Verdict::DoesNotHold
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Holds => write!(f, "holds"),
            Verdict::HoldsOnlyWhen(c) => write!(f, "holds only when {c}"),
            Verdict::DoesNotHold => write!(f, "does not hold"),
        }
    }
}

/// One claim judged.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimRow {
    /// The claim file's stem (`kv_cache`).
    pub scenario: String,
    /// The claim, in a few words.
    pub claim: String,
    /// The article's figure, quoted.
    pub article: String,
    /// What the simulation gives.
    pub simulated: String,
    /// The verdict.
    pub verdict: Verdict,
    /// Why, in a sentence.
    pub why: String,
    /// The simulated figures the verdict rests on, by name (tests pin them; `claims.csv`
    /// lists them).
    pub figures: Vec<(String, f64)>,
}

impl ClaimRow {
    /// The figure `name`, if the row has it.
    pub fn figure(&self, name: &str) -> Option<f64> {
        self.figures
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| *v)
    }
}

/// A claim's evaluator: its scenario in, its rows out.
type Evaluator = fn(&Ctx<'_>) -> Result<Vec<ClaimRow>, SimError>;

/// The evaluators, by scenario stem, in the order the articles' claims are listed.
const EVALUATORS: &[(&str, Evaluator)] = &[
    ("quantization", quantization::evaluate),
    ("kv_cache", kv_cache::evaluate),
    ("paged_attention", paged_attention::evaluate),
    ("batching", batching::evaluate),
    ("speculative", speculative::evaluate),
    ("parallelism", parallelism::evaluate),
    ("frameworks", frameworks::evaluate),
    ("capacity", capacity::evaluate),
    ("checklist", checklist::evaluate),
];

/// The claims the CPU runtime measures (`scenarios/claims/cpu/`): those whose mechanism a
/// small model on a CPU shows. Padding, quantized GPU kernels, GPU memory and multi-GPU
/// parallelism are not the CPU runtime's, so the other claims are the cost model's alone.
const CPU_EVALUATORS: &[(&str, Evaluator)] = &[
    ("batching", batching::evaluate),
    ("speculative", speculative::evaluate_measured),
];

/// Whether claims on `backend` are measured (the CPU runtime) rather than simulated (the
/// cost model). The CUDA runtime is refused: it runs synthetic weights, so it cannot measure
/// a model's acceptance or outputs.
pub fn measured_on(backend: BackendKind) -> Result<bool, SimError> {
    match backend {
        BackendKind::Model => Ok(false),
        BackendKind::Cpu => Ok(true),
        BackendKind::Cuda => Err(SimError::Scenario(ScenarioError {
            file: "--backend cuda".into(),
            msg: "the CUDA runtime runs synthetic weights, so it cannot measure a model's acceptance or outputs; the claims run on `model` or `cpu`".into(),
        })),
    }
}

fn evaluators(backend: BackendKind) -> &'static [(&'static str, Evaluator)] {
    match backend {
        BackendKind::Model => EVALUATORS,
        BackendKind::Cpu | BackendKind::Cuda => CPU_EVALUATORS,
    }
}

/// The claim names `sim claims` knows on `backend` (the scenario stems).
pub fn known(backend: BackendKind) -> Vec<&'static str> {
    evaluators(backend).iter().map(|(n, _)| *n).collect()
}

/// How to judge.
#[derive(Debug, Clone, Default)]
pub struct ClaimOptions {
    /// Where each claim's runs go (`<out>/<claim>/`; `None`: nothing written).
    pub out_dir: Option<PathBuf>,
    /// Override every run's request count (quick looks; the verdicts are argued at the
    /// scenarios' own counts).
    pub requests: Option<u64>,
    /// What runs the scenarios: the cost model, or the CPU runtime (the claims of
    /// [`CPU_EVALUATORS`]; the CUDA runtime is refused: it runs synthetic weights).
    pub backend: BackendKind,
    /// A GGUF file set as every scenario's `model.gguf` (the CPU runtime's weights).
    pub model: Option<PathBuf>,
}

/// What an evaluator works with: its scenario and where its runs go.
pub struct Ctx<'a> {
    /// The claim's scenario.
    pub scn: &'a Scenario,
    opts: &'a ClaimOptions,
    stem: String,
}

impl Ctx<'_> {
    /// The scenario's variant `name`, or an error naming the file and the variants an
    /// evaluator needs.
    pub fn variant(&self, name: &str) -> Result<&Variant, SimError> {
        self.scn
            .variants
            .iter()
            .find(|v| v.name == name)
            .ok_or_else(|| self.error(format!("the claim needs a variant named `{name}`")))
    }

    /// The request count every run is limited to (`--requests`), if any.
    pub fn requests(&self) -> Option<u64> {
        self.opts.requests
    }

    /// Whether the runs are measured on a real runtime rather than simulated.
    pub fn measured(&self) -> bool {
        self.opts.backend != BackendKind::Model
    }

    /// An error about the claim's scenario.
    pub fn error(&self, msg: String) -> SimError {
        SimError::Scenario(ScenarioError {
            file: self.scn.path.display().to_string(),
            msg,
        })
    }

    fn dir(&self, sub: &str) -> Option<PathBuf> {
        self.opts.out_dir.as_ref().map(|d| {
            let d = d.join(&self.stem);
            if sub.is_empty() {
                d
            } else {
                d.join(sub)
            }
        })
    }

    /// Runs the scenario's variants `names` (all when empty) and returns their summaries by
    /// variant name.
    pub fn run(&self, names: &[&str]) -> Result<BTreeMap<String, Summary>, SimError> {
        self.run_scenario(self.scn, names, "")
    }

    /// Runs `scn` (the claim's scenario changed by an evaluator), into `<claim>/<sub>/`.
    pub fn run_scenario(
        &self,
        scn: &Scenario,
        names: &[&str],
        sub: &str,
    ) -> Result<BTreeMap<String, Summary>, SimError> {
        let opts = RunOptions {
            out_dir: self.dir(sub),
            only: names.iter().map(|s| s.to_string()).collect(),
            ..self.run_options()
        };
        Ok(run_scenario(scn, &opts)?
            .into_iter()
            .map(|r| (r.summary.variant.clone(), r.summary))
            .collect())
    }

    /// Runs the scenario's `[sweep]` crossed with its variants.
    pub fn sweep(&self) -> Result<Vec<SweepRun>, SimError> {
        if self.scn.sweep.is_empty() {
            return Err(self.error("the claim is about a trend: it needs a [sweep]".into()));
        }
        let opts = RunOptions {
            out_dir: self.dir(""),
            ..self.run_options()
        };
        run_sweep(self.scn, &opts, None)
    }

    /// The first and the last point `runs` ran (a sweep's low and high ends).
    pub fn ends(&self, runs: &[SweepRun]) -> Result<(usize, usize), SimError> {
        let points = sweep_points(runs);
        match (points.first(), points.last()) {
            (Some(&lo), Some(&hi)) => Ok((lo, hi)),
            _ => Err(self.error("the sweep ran no point".into())),
        }
    }

    /// The runs' options: the request override and the backend; a real runtime runs one
    /// variant at a time under the inline driver, so that runs do not share the cores they
    /// are timed on.
    fn run_options(&self) -> RunOptions {
        let measured = self.measured();
        RunOptions {
            requests: self.opts.requests,
            backend: self.opts.backend,
            parallel: !measured,
            driver: if measured {
                DriverKind::Inline
            } else {
                RunOptions::default().driver
            },
            ..RunOptions::default()
        }
    }
}

/// The summary of `variant` in `runs`.
pub fn summary<'a>(
    runs: &'a BTreeMap<String, Summary>,
    variant: &str,
) -> Result<&'a Summary, SimError> {
    runs.get(variant).ok_or_else(|| {
        SimError::Scenario(ScenarioError {
            file: "claims".into(),
            msg: format!("no run of variant `{variant}`"),
        })
    })
}

/// The claim scenarios to judge: `path` itself when it is a file, else the folder's
/// `*.toml` files in the order of the backend's evaluators; `only` keeps the named ones. A
/// file whose stem names no evaluator of the backend is an error.
pub fn claim_files(
    path: &Path,
    only: &[String],
    backend: BackendKind,
) -> Result<Vec<PathBuf>, SimError> {
    let table = evaluators(backend);
    let files: Vec<PathBuf> = if path.is_file() {
        vec![path.to_path_buf()]
    } else {
        let rd = std::fs::read_dir(path).map_err(|source| SimError::Io {
            path: path.display().to_string(),
            source,
        })?;
        let mut v: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "toml"))
            .collect();
        v.sort_by_key(|p| {
            let stem = stem(p);
            table
                .iter()
                .position(|(n, _)| *n == stem)
                .unwrap_or(usize::MAX)
        });
        v
    };
    let known = known(backend);
    for f in &files {
        evaluator(f, backend)?;
    }
    for o in only {
        if !known.contains(&o.as_str()) {
            return Err(SimError::Scenario(ScenarioError {
                file: path.display().to_string(),
                msg: format!("--only: no claim `{o}` (the claims: {})", known.join(", ")),
            }));
        }
    }
    Ok(files
        .into_iter()
        .filter(|f| only.is_empty() || only.contains(&stem(f)))
        .collect())
}

/// The evaluator of the claim scenario `path` (by its stem) on `backend`, or an error
/// listing them.
fn evaluator(path: &Path, backend: BackendKind) -> Result<Evaluator, SimError> {
    let stem = stem(path);
    evaluators(backend)
        .iter()
        .find(|(n, _)| *n == stem)
        .map(|(_, e)| *e)
        .ok_or_else(|| {
            SimError::Scenario(ScenarioError {
                file: path.display().to_string(),
                msg: format!(
                    "no claim is named `{stem}`{} (the claims: {})",
                    match backend {
                        BackendKind::Model => "",
                        _ => " on a real runtime",
                    },
                    known(backend).join(", ")
                ),
            })
        })
}

fn stem(p: &Path) -> String {
    p.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Judges one claim scenario.
pub fn evaluate(path: &Path, opts: &ClaimOptions) -> Result<Vec<ClaimRow>, SimError> {
    let eval = evaluator(path, opts.backend)?;
    let stem = stem(path);
    measured_on(opts.backend)?;
    let scn = match &opts.model {
        Some(m) => {
            let abs = std::path::absolute(m).map_err(|e| SimError::Io {
                path: m.display().to_string(),
                source: e,
            })?;
            Scenario::load_with(
                path,
                None,
                &[("model.gguf", toml::Value::String(abs.display().to_string()))],
            )?
        }
        None => Scenario::load(path, None)?,
    };
    let ctx = Ctx {
        scn: &scn,
        opts,
        stem: stem.clone(),
    };
    let mut rows = eval(&ctx)?;
    let measured_on = ctx.measured().then(|| {
        let model = scn.variants.first().map_or_else(String::new, |v| {
            v.config
                .model
                .gguf
                .as_ref()
                .and_then(|g| g.file_name())
                .map_or_else(
                    || v.deployment.model.name.to_string(),
                    |f| f.to_string_lossy().into_owned(),
                )
        });
        format!(" (measured on the CPU runtime, {model})")
    });
    for r in &mut rows {
        r.scenario = stem.clone();
        if let Some(m) = &measured_on {
            r.claim.push_str(m);
        }
    }
    Ok(rows)
}

/// The rows as a Markdown table (what `sim claims` prints and README quotes).
pub fn table(rows: &[ClaimRow]) -> String {
    let mut s = String::from(
        "| claim | the article | simulated | verdict | why |\n|---|---|---|---|---|\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            r.claim, r.article, r.simulated, r.verdict, r.why
        ));
    }
    s
}

/// Writes `claims.csv` and `claims.md` into `dir`.
pub fn write(dir: &Path, rows: &[ClaimRow]) -> Result<(), SimError> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| SimError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let md = dir.join("claims.md");
    std::fs::write(&md, table(rows)).map_err(io(&md))?;
    let csv_path = dir.join("claims.csv");
    let mut w = csv::Writer::from_path(&csv_path).map_err(|e| SimError::Io {
        path: csv_path.display().to_string(),
        source: e.into(),
    })?;
    let to_io = |e: csv::Error| SimError::Io {
        path: csv_path.display().to_string(),
        source: e.into(),
    };
    w.write_record([
        "scenario",
        "claim",
        "article",
        "simulated",
        "verdict",
        "why",
        "figures",
    ])
    .map_err(to_io)?;
    for r in rows {
        let verdict = r.verdict.to_string();
        let figures = r
            .figures
            .iter()
            .map(|(k, v)| format!("{k}={v:.6}"))
            .collect::<Vec<_>>()
            .join("; ");
        w.write_record([
            r.scenario.as_str(),
            &r.claim,
            &r.article,
            &r.simulated,
            &verdict,
            &r.why,
            &figures,
        ])
        .map_err(to_io)?;
    }
    w.flush().map_err(io(&csv_path))?;
    Ok(())
}

/// The points a sweep ran, in order.
pub fn sweep_points(runs: &[SweepRun]) -> Vec<usize> {
    let mut p: Vec<usize> = runs.iter().map(|r| r.point).collect();
    p.sort_unstable();
    p.dedup();
    p
}

/// A point's swept values, `key value` by each key's last part (`concurrency 16`).
pub fn point_label(runs: &[SweepRun], point: usize) -> String {
    runs.iter()
        .find(|r| r.point == point)
        .map(|r| {
            r.values
                .iter()
                .map(|(k, v)| format!("{} {v}", k.rsplit('.').next().unwrap_or(k)))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}

/// The value (as written in TOML) of the swept key ending in `suffix` (`rate`) at `point`.
pub fn swept<'a>(runs: &'a [SweepRun], point: usize, suffix: &str) -> Option<&'a str> {
    runs.iter()
        .find(|r| r.point == point)?
        .values
        .iter()
        .find(|(k, _)| k.ends_with(suffix))
        .map(|(_, v)| v.as_str())
}

/// The summary of `variant` at sweep point `point`.
pub fn at<'a>(runs: &'a [SweepRun], point: usize, variant: &str) -> Result<&'a Summary, SimError> {
    runs.iter()
        .find(|r| r.point == point && r.variant == variant)
        .map(|r| &r.summary)
        .ok_or_else(|| {
            SimError::Scenario(ScenarioError {
                file: "claims".into(),
                msg: format!("no run of variant `{variant}` at sweep point {point}"),
            })
        })
}

/// Named figures for [`ClaimRow::figures`].
pub fn figs(figures: &[(&str, f64)]) -> Vec<(String, f64)> {
    figures.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// `x` times, with two significant decimals (`4.2x`).
pub fn times(x: f64) -> String {
    if x >= 10.0 {
        format!("{x:.0}x")
    } else {
        format!("{x:.1}x")
    }
}

/// Bytes as GB (10^9) with one decimal.
pub fn gb(bytes: f64) -> String {
    format!("{:.1} GB", bytes / 1e9)
}

/// Whether `x` lies in `[lo, hi]` widened by `slack` (a fraction) on each side: the
/// articles round their figures, so a simulated figure within 10% of their range agrees.
pub fn within(x: f64, lo: f64, hi: f64, slack: f64) -> bool {
    x >= lo * (1.0 - slack) && x <= hi * (1.0 + slack)
}
