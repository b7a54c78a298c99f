//! `sim fidelity`: the cost model against a real backend on one scenario: both runs with the
//! same seed, per variant and metric the simulated value, the measured one and the error (TTFT,
//! TPOT, E2EL at p50/p90/p99, throughput, step-time percentiles); written as `fidelity.csv`
//! too.

use std::path::PathBuf;

use sim::run::{run_scenario, BackendKind, RunOptions};
use sim::scenario::Scenario;

/// The cost model against a real backend on one scenario: both runs with the same
/// seed, per variant and metric the simulated value, the measured one and the error
/// (TTFT, TPOT, E2EL at p50/p90/p99, throughput, step-time percentiles); written as
/// `fidelity.csv` too.
#[derive(clap::Args)]
pub struct Args {
    /// Scenario TOML file.
    pub scenario: PathBuf,
    /// The calibration the cost model runs with (a `sim calibrate` output).
    #[arg(long)]
    pub calibration: PathBuf,
    /// The measured side (cuda: the GPU; cpu: the CPU runtime).
    #[arg(long, value_enum, default_value_t = BackendKind::Cuda)]
    pub backend: BackendKind,
    /// Override the workload's request count (e.g. to fit a GPU session).
    #[arg(long)]
    pub requests: Option<u64>,
    /// Output folder (default: results/<scenario>-fidelity).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Score a recorded real run instead of running the backend: the `measured/` folder
    /// an earlier `sim fidelity` wrote (a `<variant>/summary.json` and `steps.csv` each),
    /// e.g. to try a new calibration against a GPU run without the GPU. Give the same
    /// `--requests` as that run.
    #[arg(long, value_name = "DIR")]
    pub measured: Option<PathBuf>,
}

/// Runs `sim fidelity`, printing into `out`.
pub fn run(args: Args, out: &mut String) -> anyhow::Result<()> {
    let Args {
        scenario,
        calibration,
        backend,
        requests,
        out: out_dir,
        measured,
    } = args;
    if backend == BackendKind::Model {
        anyhow::bail!(
            "--backend model: fidelity compares the cost model with a real backend (cuda or cpu)"
        );
    }
    if backend == BackendKind::Cuda && measured.is_none() {
        kernels::cuda::probe().map_err(|e| {
            anyhow::anyhow!(
                "sim fidelity --backend cuda runs the scenario on an NVIDIA GPU and found none ({e}). On a GPU machine run: sim calibrate --backend cuda --model <the scenario's model> --out calib.toml, then sim fidelity {} --calibration calib.toml",
                scenario.display()
            )
        })?;
    }
    let measured_scn = Scenario::load(&scenario, None)?;
    let simulated_scn = Scenario::load_calibrated(&scenario, None, &calibration)?;
    let out_dir = out_dir.unwrap_or_else(|| {
        PathBuf::from("results").join(format!("{}-fidelity", measured_scn.name))
    });
    let run_one = |scn: &Scenario, b: BackendKind, dir: PathBuf| {
        run_scenario(
            scn,
            &RunOptions {
                out_dir: Some(dir),
                driver: sim::driver::DriverKind::Inline,
                only: Vec::new(),
                progress: false,
                parallel: b == BackendKind::Model,
                backend: b,
                requests,
            },
        )
    };
    let measured_dir = measured.clone().unwrap_or_else(|| out_dir.join("measured"));
    let real: Vec<analysis::Summary> = match &measured {
        None => run_one(&measured_scn, backend, measured_dir.clone())?
            .into_iter()
            .map(|r| r.summary)
            .collect(),
        Some(dir) => recorded_summaries(&measured_scn, dir)?,
    };
    let sim_runs = run_one(
        &simulated_scn,
        BackendKind::Model,
        out_dir.join("simulated"),
    )?;
    let mut rows = Vec::new();
    for r in &real {
        let v = &r.variant;
        let Some(s) = sim_runs.iter().find(|x| &x.summary.variant == v) else {
            continue;
        };
        if s.summary.completed != r.completed && measured.is_some() {
            anyhow::bail!(
                "--measured {}: variant `{v}` completed {} requests there and {} here: give the --requests that run had",
                measured_dir.display(),
                r.completed,
                s.summary.completed
            );
        }
        let steps = |dir: PathBuf| {
            sim::cost_model::validation::fidelity::step_percentiles(&dir.join(v))
                .map_err(|e| anyhow::anyhow!(e))
        };
        rows.extend(sim::cost_model::validation::fidelity::fidelity_rows(
            v,
            &s.summary,
            r,
            steps(out_dir.join("simulated"))?,
            steps(measured_dir.clone())?,
        ));
    }
    let (table, csv) = sim::cost_model::validation::fidelity::fidelity_outputs(&rows);
    let path = out_dir.join("fidelity.csv");
    std::fs::write(&path, csv).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let against = measured.as_ref().map_or_else(
        || format!("--backend {backend:?}"),
        |d| format!("the run recorded in {}", d.display()),
    );
    outln!(
        out,
        "fidelity of `{}`: cost model (calibration {}) against {against}",
        measured_scn.name,
        calibration.display(),
    );
    outln!(out, "{table}");
    outln!(out, "wrote {}", path.display());
    Ok(())
}

/// The summaries of a recorded run, one per variant of `scn` (`DIR/<variant>/summary.json`).
fn recorded_summaries(
    scn: &Scenario,
    dir: &std::path::Path,
) -> anyhow::Result<Vec<analysis::Summary>> {
    scn.variants
        .iter()
        .map(|v| {
            let path = dir.join(&v.name).join("summary.json");
            if !path.is_file() {
                anyhow::bail!(
                    "--measured {}: no {} (a `measured/` folder of `sim fidelity`, one folder per variant of {})",
                    dir.display(),
                    path.display(),
                    scn.name
                );
            }
            analysis::read_summary_json(&path).map_err(|e| anyhow::anyhow!("{e}"))
        })
        .collect()
}
