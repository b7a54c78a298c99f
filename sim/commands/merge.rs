//! `sim merge`: join the output folders of a sharded sweep (`sim run --shard i/N`) into one
//! result set, identical to an unsharded run's.

use std::path::PathBuf;

/// Join the output folders of a sharded sweep (`sim run --shard i/N`) into one result
/// set, identical to an unsharded run's.
#[derive(clap::Args)]
pub struct Args {
    /// The shards' output folders.
    #[arg(required = true)]
    pub dirs: Vec<PathBuf>,
    /// Where the merged results go.
    #[arg(long)]
    pub out: PathBuf,
}

/// Runs `sim merge`, printing into `out`.
pub fn run(args: Args, out: &mut String) -> anyhow::Result<()> {
    let Args { dirs, out: to } = args;
    let n = sim::sweep::merge(&dirs, &to)?;
    sim::sweep::finish_sweep(&to)?;
    let report = analysis::report::write_reports(&to)?;
    outln!(
        out,
        "merged {n} runs of {} shards into {} (report: {})",
        dirs.len(),
        to.display(),
        report.display()
    );
    Ok(())
}
