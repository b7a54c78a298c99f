//! `sim validate-model`: compare the cost model with every row of calibration/calibration.csv
//! and Vidur's operator profiles, and write the table (VALIDATION.md).

use std::path::PathBuf;

/// Compare the cost model with every row of calibration/calibration.csv and Vidur's
/// operator profiles, and write the table (VALIDATION.md).
#[derive(clap::Args)]
pub struct Args {
    /// Folder with calibration.csv and the vidur_*.csv profiles.
    #[arg(long, default_value = "calibration")]
    pub data: PathBuf,
    /// Markdown file to write.
    #[arg(long, default_value = "VALIDATION.md")]
    pub out: PathBuf,
}

/// Runs `sim validate-model`, printing into `out`.
pub fn run(args: Args, out: &mut String) -> anyhow::Result<()> {
    let Args { data, out: path } = args;
    let calibration =
        sim::cost_model::validation::calibration_checks(&data.join("calibration.csv"))?;
    let profiles = sim::cost_model::validation::profile_checks(&data)?;
    let throughput = sim::cost_model::validation::throughput_checks(&data.join("calibration.csv"))?;
    let splitwise =
        sim::cost_model::calibration::splitwise_measurements(&data.join("calibration.csv"))?;
    let held_out = sim::cost_model::calibration::vllm_2023_held_out(&splitwise);
    let gemm_held_out = sim::cost_model::calibration::gemm_held_out(&data)?;
    let text = sim::cost_model::validation::report(
        &calibration,
        &profiles,
        &throughput,
        &held_out,
        &gemm_held_out,
    );
    std::fs::write(&path, &text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if let Some(summary) = text.split("## Summary").nth(1) {
        outln!(out, "{}", summary.trim());
    }
    outln!(out, "wrote {}", path.display());
    Ok(())
}
