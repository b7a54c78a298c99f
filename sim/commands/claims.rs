//! `sim claims`: the founding articles' claims judged on their scenarios
//! (`scenarios/claims/`): each claim's figure beside the simulated one, with a verdict and
//! the reason; the table printed and written as `claims.csv` and `claims.md`.

use std::path::PathBuf;

use sim::claims::{self, ClaimOptions};

/// The articles' claims, tested: runs each claim scenario of a folder (or one file) and
/// prints claim, the article's figure, the simulated figure, holds / holds only when ...
/// / does not hold, and why.
#[derive(clap::Args)]
pub struct Args {
    /// A claims folder or one claim's scenario.
    #[arg(default_value = "scenarios/claims")]
    pub path: PathBuf,
    /// Judge only these claims (repeatable: quantization, kv_cache, paged_attention,
    /// batching, speculative, parallelism, frameworks, capacity, checklist).
    #[arg(long)]
    pub only: Vec<String>,
    /// Output folder: each claim's runs, `claims.csv` and `claims.md`.
    #[arg(long, default_value = "results/claims")]
    pub out: PathBuf,
    /// Override every run's request count (a quick look; the verdicts are argued at the
    /// scenarios' own counts).
    #[arg(long)]
    pub requests: Option<u64>,
}

/// Runs `sim claims`, printing into `out`.
pub fn run(args: Args, out: &mut String) -> anyhow::Result<()> {
    let Args {
        path,
        only,
        out: dir,
        requests,
    } = args;
    if requests == Some(0) {
        anyhow::bail!("--requests: must be at least 1");
    }
    let files = claims::claim_files(&path, &only)?;
    if files.is_empty() {
        anyhow::bail!("{}: no claim scenario (*.toml) to judge", path.display());
    }
    let opts = ClaimOptions {
        out_dir: Some(dir.clone()),
        requests,
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
