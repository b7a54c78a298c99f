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
}

/// Runs `sim fidelity`, printing into `out`.
pub fn run(args: Args, out: &mut String) -> anyhow::Result<()> {
    let Args {
        scenario,
        calibration,
        backend,
        requests,
        out: out_dir,
    } = args;
    if backend == BackendKind::Model {
        anyhow::bail!(
            "--backend model: fidelity compares the cost model with a real backend (cuda or cpu)"
        );
    }
    if backend == BackendKind::Cuda {
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
    let real = run_one(&measured_scn, backend, out_dir.join("measured"))?;
    let sim_runs = run_one(
        &simulated_scn,
        BackendKind::Model,
        out_dir.join("simulated"),
    )?;
    let mut rows = Vec::new();
    for r in &real {
        let v = &r.summary.variant;
        let Some(s) = sim_runs.iter().find(|x| &x.summary.variant == v) else {
            continue;
        };
        let steps = |side: &str| {
            sim::cost_model::validation::fidelity::step_percentiles(&out_dir.join(side).join(v))
                .map_err(|e| anyhow::anyhow!(e))
        };
        rows.extend(sim::cost_model::validation::fidelity::fidelity_rows(
            v,
            &s.summary,
            &r.summary,
            steps("simulated")?,
            steps("measured")?,
        ));
    }
    let (table, csv) = sim::cost_model::validation::fidelity::fidelity_outputs(&rows);
    let path = out_dir.join("fidelity.csv");
    std::fs::write(&path, csv).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    outln!(
        out,
        "fidelity of `{}`: cost model (calibration {}) against --backend {:?}",
        measured_scn.name,
        calibration.display(),
        backend
    );
    outln!(out, "{table}");
    outln!(out, "wrote {}", path.display());
    Ok(())
}
