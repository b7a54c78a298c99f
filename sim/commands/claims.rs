//! `sim claims`: the founding articles' claims judged on their scenarios
//! (`scenarios/claims/`): each claim's figure beside the simulated one, with a verdict and
//! the reason; the table printed and written as `claims.csv` and `claims.md`.

use std::path::PathBuf;

use sim::claims::{self, ClaimOptions};
use sim::run::BackendKind;

/// The articles' claims, tested: runs each claim scenario of a folder (or one file) and
/// prints claim, the article's figure, the simulated figure, holds / holds only when ...
/// / does not hold, and why.
#[derive(clap::Args)]
pub struct Args {
    /// A claims folder or one claim's scenario (default `scenarios/claims`, or
    /// `scenarios/claims/cpu` with `--backend cpu`).
    pub path: Option<PathBuf>,
    /// Judge only these claims (repeatable: quantization, kv_cache, paged_attention,
    /// batching, speculative, parallelism, frameworks, capacity, checklist; on the CPU
    /// runtime: batching, speculative).
    #[arg(long)]
    pub only: Vec<String>,
    /// Output folder: each claim's runs, `claims.csv` and `claims.md` (default
    /// `results/claims`, or `results/claims-cpu` with `--backend cpu`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Override every run's request count (a quick look; the verdicts are argued at the
    /// scenarios' own counts).
    #[arg(long)]
    pub requests: Option<u64>,
    /// What runs the scenarios: the cost model, or the CPU runtime (the claims it can
    /// measure, with the weights of `--model`; its figures are wall-clock measurements).
    #[arg(long, value_enum, default_value_t = BackendKind::Model)]
    pub backend: BackendKind,
    /// A GGUF model file set as the scenarios' `model.gguf` (with `--backend cpu`).
    #[arg(long)]
    pub model: Option<PathBuf>,
}

/// Runs `sim claims`, printing into `out`.
pub fn run(args: Args, out: &mut String) -> anyhow::Result<()> {
    let Args {
        path,
        only,
        out: dir,
        requests,
        backend,
        model,
    } = args;
    if requests == Some(0) {
        anyhow::bail!("--requests: must be at least 1");
    }
    let measured = claims::measured_on(backend)?;
    if measured && model.is_none() {
        anyhow::bail!(
            "--backend cpu: --model FILE.gguf names the weights the CPU runtime runs (e.g. ~/.cache/sim-models/SmolLM2-135M-Instruct.Q4_1.gguf; README, The real model)"
        );
    }
    if model.is_some() && !measured {
        anyhow::bail!("--model: the weights are run by the CPU runtime: add --backend cpu");
    }
    if let Some(m) = &model {
        if !m.is_file() {
            anyhow::bail!("--model: {}: no such file (a GGUF model)", m.display());
        }
    }
    let (claims_dir, results_dir) = if measured {
        ("scenarios/claims/cpu", "results/claims-cpu")
    } else {
        ("scenarios/claims", "results/claims")
    };
    let path = path.unwrap_or_else(|| claims_dir.into());
    let dir = dir.unwrap_or_else(|| results_dir.into());
    let files = claims::claim_files(&path, &only, backend)?;
    if files.is_empty() {
        anyhow::bail!("{}: no claim scenario (*.toml) to judge", path.display());
    }
    let opts = ClaimOptions {
        out_dir: Some(dir.clone()),
        requests,
        backend,
        model,
    };
    let mut rows = Vec::new();
    for f in &files {
        rows.extend(claims::evaluate(f, &opts)?);
    }
    claims::write(&dir, &rows)?;
    out.push_str(&claims::table(&rows));
    outln!(out);
    outln!(
        out,
        "{} claims from {} scenarios; wrote {} and {}",
        rows.len(),
        files.len(),
        dir.join("claims.csv").display(),
        dir.join("claims.md").display()
    );
    Ok(())
}
