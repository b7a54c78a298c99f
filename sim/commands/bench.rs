//! `sim bench`: time a scenario's variants (one after another, nothing written): simulated
//! requests per wall second, steps per second, peak memory.

use std::path::PathBuf;

use sim::driver::DriverKind;
use sim::scenario::Scenario;

/// Time a scenario's variants (one after another, nothing written): simulated
/// requests per wall second, steps per second, peak memory.
#[derive(clap::Args)]
pub struct Args {
    /// Scenario TOML file.
    pub scenario: PathBuf,
    /// Override the workload's request count.
    #[arg(long)]
    pub requests: Option<u64>,
    /// Driver.
    #[arg(long, value_enum, default_value_t = DriverKind::Actors)]
    pub driver: DriverKind,
    /// Run only this variant (repeatable).
    #[arg(long = "variant")]
    pub variants: Vec<String>,
}

/// Runs `sim bench`, printing into `out`.
pub fn run(args: Args, out: &mut String) -> anyhow::Result<()> {
    let Args {
        scenario,
        requests,
        driver,
        variants,
    } = args;
    if requests == Some(0) {
        anyhow::bail!("--requests: must be at least 1");
    }
    let scn = Scenario::load(&scenario, None)?;
    let results = sim::run::bench_scenario(&scn, driver, &variants, requests)?;
    outln!(
        out,
        "{:<14} {:>10} {:>10} {:>9} {:>14} {:>12} {:>12}",
        "variant",
        "requests",
        "steps",
        "wall s",
        "requests/s",
        "steps/s",
        "sim s"
    );
    for r in &results {
        outln!(
            out,
            "{:<14} {:>10} {:>10} {:>9.3} {:>14.0} {:>12.0} {:>12.1}",
            r.variant,
            r.requests,
            r.steps,
            r.wall_s,
            r.requests as f64 / r.wall_s,
            r.steps as f64 / r.wall_s,
            r.simulated_s
        );
    }
    match sim::run::peak_rss_bytes() {
        Some(b) => outln!(
            out,
            "peak RSS {:.1} MiB ({driver:?} driver)",
            b as f64 / 1048576.0
        ),
        None => outln!(out, "peak RSS n/a ({driver:?} driver)"),
    }
    Ok(())
}
