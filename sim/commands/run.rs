//! `sim run`: every variant of a scenario on the same request stream, the comparison
//! printed and the results written (`sim::run`); a scenario with a `[sweep]` runs every
//! point crossed with the variants (`sim::sweep`, optionally one shard of them); `--seeds N`
//! runs replicas and reports every metric's mean with a 95% interval.

use std::path::{Path, PathBuf};

use sim::driver::DriverKind;
use sim::run::{run_scenario, BackendKind, RunOptions};
use sim::scenario::Scenario;
use sim::sweep::Shard;

/// Run every variant of a scenario and compare them.
#[derive(clap::Args)]
pub struct Args {
    /// Scenario TOML file.
    pub scenario: PathBuf,
    /// Output folder (default: results/<scenario name>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Seed of the workload's random streams (default: the scenario's `seed`).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Backend that executes the steps.
    #[arg(long, value_enum, default_value_t = BackendKind::Model)]
    pub backend: BackendKind,
    /// Driver: actix actors (default) or the inline loop (same results, faster).
    #[arg(long, value_enum, default_value_t = DriverKind::Actors)]
    pub driver: DriverKind,
    /// Run only this variant (repeatable).
    #[arg(long = "variant")]
    pub variants: Vec<String>,
    /// Override the workload's request count (e.g. to fit a GPU session).
    #[arg(long)]
    pub requests: Option<u64>,
    /// Hide the progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// A calibration file (a `sim calibrate` output) for the cost model, as if the
    /// scenario's `[cost]` had `calibration = FILE` (its own keys still win).
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// Replicas: run the scenario with N seeds (from --seed or the scenario's), each
    /// into `<out>/seed-<s>/`, and report every metric's mean with a 95% interval.
    #[arg(long, default_value_t = 1)]
    pub seeds: u32,
    /// Run one N-th of a sweep's runs (`i/N`, from 0/N; e.g. one task of a Slurm
    /// array): every run whose index is i modulo N. `sim merge` joins the shards.
    #[arg(long)]
    pub shard: Option<Shard>,
}

/// Runs `sim run`, printing into `out`.
pub fn run(args: Args, out: &mut String) -> anyhow::Result<()> {
    if args.requests == Some(0) {
        anyhow::bail!("--requests: must be at least 1");
    }
    if args.seeds == 0 {
        anyhow::bail!("--seeds: must be at least 1");
    }
    let scn = load(&args, args.seed)?;
    let out_dir = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("results").join(&scn.name));
    if args.seeds > 1 {
        if !scn.sweep.is_empty() || args.shard.is_some() {
            anyhow::bail!("--seeds: replicas of a sweep are not supported; sweep `seed` instead ([sweep] seed = [1, 2, 3])");
        }
        return run_replicas(&args, &scn, &out_dir, out);
    }
    let opts = options(&args, out_dir.clone());
    if !scn.sweep.is_empty() {
        return run_sweep(&scn, &opts, args.shard, &args.scenario, &out_dir, out);
    }
    if args.shard.is_some() {
        anyhow::bail!(
            "--shard: {} has no [sweep] to split",
            args.scenario.display()
        );
    }
    let results = run_scenario(&scn, &opts).map_err(|e| match e {
        // Scenario errors already name the file.
        sim::SimError::Scenario(_) => anyhow::Error::from(e),
        other => anyhow::anyhow!("{}: {other}", args.scenario.display()),
    })?;
    let summaries: Vec<_> = results.iter().map(|r| r.summary.clone()).collect();
    outln!(
        out,
        "scenario `{}`: {} variants, seed {}, backend {:?}",
        scn.name,
        summaries.len(),
        scn.seed,
        args.backend
    );
    outln!(out, "{}", analysis::comparison_table(&summaries));
    for r in &results {
        for w in &r.warnings {
            outln!(out, "warning: {w}");
        }
    }
    // A calibration that records its k-fold fits: the same variants under each fold's fit.
    if args.backend == BackendKind::Model {
        let bands = sim::bands::bands(&scn, &results, args.requests)?;
        if !bands.is_empty() {
            sim::bands::write_csv(&out_dir.join("bands.csv"), &bands)?;
            outln!(out, "{}", sim::bands::table(&bands).trim_end());
        }
    }
    let report = analysis::report::write_reports(&out_dir)?;
    outln!(
        out,
        "results in {} (report: {})",
        out_dir.display(),
        report.display()
    );
    Ok(())
}

/// The scenario with `seed` (or its own), calibrated when `--calibration` says so.
fn load(args: &Args, seed: Option<u64>) -> anyhow::Result<Scenario> {
    Ok(match &args.calibration {
        Some(c) => Scenario::load_calibrated(&args.scenario, seed, c)?,
        None => Scenario::load(&args.scenario, seed)?,
    })
}

/// How the command line asks to run, results going to `out_dir`.
fn options(args: &Args, out_dir: PathBuf) -> RunOptions {
    RunOptions {
        out_dir: Some(out_dir),
        driver: args.driver,
        only: args.variants.clone(),
        progress: !args.quiet,
        parallel: true,
        backend: args.backend,
        requests: args.requests,
    }
}

/// `--seeds N`: the scenario with seeds `first..first + N`, each into `<out>/seed-<s>/`,
/// and the replicas' table.
fn run_replicas(
    args: &Args,
    scn: &Scenario,
    out_dir: &Path,
    out: &mut String,
) -> anyhow::Result<()> {
    let first = scn.seed;
    let last = first
        .checked_add(u64::from(args.seeds) - 1)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--seeds {}: the seeds from {first} on pass the largest 64-bit seed",
                args.seeds
            )
        })?;
    let mut dirs = Vec::new();
    for s in first..=last {
        let replica = load(args, Some(s))?;
        let dir = out_dir.join(format!("seed-{s}"));
        run_scenario(&replica, &options(args, dir.clone())).map_err(|e| match e {
            sim::SimError::Scenario(_) => anyhow::Error::from(e),
            other => anyhow::anyhow!("{}: seed {s}: {other}", args.scenario.display()),
        })?;
        analysis::report::write_reports(&dir)?;
        dirs.push(dir);
    }
    // Only this call's replicas (an earlier run may have left others).
    let set = analysis::replicas::read_runs(&dirs)?;
    outln!(
        out,
        "scenario `{}`: {} seeds ({first}..{last}), backend {:?}",
        scn.name,
        args.seeds,
        args.backend
    );
    outln!(out, "{}", analysis::replicas::replicas_table(&set));
    outln!(
        out,
        "results in {} (one folder per seed)",
        out_dir.display()
    );
    Ok(())
}

/// A scenario with a `[sweep]`: every point crossed with the variants, a
/// compact table of the runs, and the speedup map when variants speculate.
fn run_sweep(
    scn: &Scenario,
    opts: &RunOptions,
    shard: Option<Shard>,
    file: &Path,
    out_dir: &Path,
    out: &mut String,
) -> anyhow::Result<()> {
    let runs = sim::sweep::run_sweep(scn, opts, shard).map_err(|e| match e {
        sim::SimError::Scenario(_) => anyhow::Error::from(e),
        other => anyhow::anyhow!("{}: {other}", file.display()),
    })?;
    outln!(
        out,
        "scenario `{}`: sweep of {} ({} points) x {} variants, {} runs{}, seed {}",
        scn.name,
        scn.sweep_keys().join(" x "),
        scn.sweep_points().len(),
        scn.variants.len(),
        runs.len(),
        shard.map_or(String::new(), |s| format!(
            " (shard {}/{})",
            s.index, s.count
        )),
        scn.seed
    );
    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::ASCII_FULL_CONDENSED);
    let mut header: Vec<String> = scn
        .sweep_keys()
        .iter()
        .map(|k| k.rsplit('.').next().unwrap_or(k).to_string())
        .collect();
    header.extend(
        [
            "variant",
            "req/s",
            "out tok/s",
            "mean TTFT ms",
            "p99 TTFT ms",
            "mean TPOT ms",
            "p99 TPOT ms",
            "accept len",
        ]
        .map(String::from),
    );
    table.set_header(header);
    for r in &runs {
        let s = &r.summary;
        let mut row: Vec<String> = r.values.iter().map(|(_, v)| v.clone()).collect();
        row.extend([
            r.variant.clone(),
            format!("{:.3}", s.request_throughput),
            format!("{:.1}", s.output_throughput),
            format!("{:.1}", s.mean_ttft_ms),
            format!("{:.1}", s.p99_ttft_ms),
            format!("{:.2}", s.mean_tpot_ms),
            format!("{:.2}", s.p99_tpot_ms),
            s.speculative
                .as_ref()
                .map_or("-".into(), |x| format!("{:.2}", x.mean_acceptance_length)),
        ]);
        table.add_row(row);
    }
    outln!(out, "{table}");
    if shard.is_none() {
        if let Some(map) = sim::sweep::finish_sweep(out_dir)? {
            outln!(out, "{map}");
        }
    }
    if shard.is_none() {
        let report = analysis::report::write_reports(out_dir)?;
        outln!(
            out,
            "results in {} (report: {})",
            out_dir.display(),
            report.display()
        );
    } else {
        outln!(
            out,
            "results in {} (join the shards with `sim merge`)",
            out_dir.display()
        );
    }
    Ok(())
}
