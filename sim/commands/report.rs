//! `sim report`: rebuild `report.html` of a results folder (a run's or a sweep's) from its
//! files.

use std::path::PathBuf;

/// Rebuild `report.html` of a results folder (a run's or a sweep's) from its files.
#[derive(clap::Args)]
pub struct Args {
    /// The folder `sim run` wrote.
    pub dir: PathBuf,
}

/// Runs `sim report`, printing into `out`.
pub fn run(args: Args, out: &mut String) -> anyhow::Result<()> {
    let Args { dir } = args;
    let report = analysis::report::write_reports(&dir)?;
    outln!(out, "wrote {}", report.display());
    Ok(())
}
