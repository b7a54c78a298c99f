//! `sim compare`: compare two result sets (run folders, or folders of `--seeds` replicas): per
//! variant and metric, both means with 95% intervals, the change and Welch's p-value.

use std::path::PathBuf;

/// Compare two result sets (run folders, or folders of `--seeds` replicas): per
/// variant and metric, both means with 95% intervals, the change and Welch's p-value.
#[derive(clap::Args)]
pub struct Args {
    /// The reference results.
    pub a: PathBuf,
    /// The results compared with them.
    pub b: PathBuf,
    /// Also write the comparison as CSV here.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Runs `sim compare`, printing into `out`.
pub fn run(args: Args, out: &mut String) -> anyhow::Result<()> {
    let Args { a, b, out: csv_out } = args;
    let sa = analysis::replicas::read_result_set(&a)?;
    let sb = analysis::replicas::read_result_set(&b)?;
    let deltas = analysis::replicas::compare(&sa, &sb);
    if deltas.is_empty() {
        anyhow::bail!(
            "{} and {} share no variant (A has {:?}, B has {:?})",
            a.display(),
            b.display(),
            sa.keys().collect::<Vec<_>>(),
            sb.keys().collect::<Vec<_>>()
        );
    }
    let (table, csv) = analysis::replicas::compare_outputs(&deltas);
    outln!(out, "A = {}, B = {}", a.display(), b.display());
    outln!(out, "{table}");
    if let Some(p) = csv_out {
        std::fs::write(&p, csv).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
        outln!(out, "wrote {}", p.display());
    }
    Ok(())
}
