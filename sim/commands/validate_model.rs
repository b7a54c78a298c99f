//! `sim validate-model`: compare the cost model with every row of calibration/calibration.csv
//! and Vidur's operator profiles, and write the table (VALIDATION.md).

use sim::replay::ProfileChoice;
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
    /// Also write every simulated aiconfigurator row (measured and simulated TTFT, TPOT)
    /// to this CSV.
    #[arg(long)]
    pub silicon_csv: Option<PathBuf>,
}

/// Runs `sim validate-model`, printing into `out`.
pub fn run(args: Args, out: &mut String) -> anyhow::Result<()> {
    let Args {
        data,
        out: path,
        silicon_csv,
    } = args;
    let calibration =
        sim::cost_model::validation::calibration_checks(&data.join("calibration.csv"))?;
    let profiles = sim::cost_model::validation::profile_checks(&data)?;
    let throughput = sim::cost_model::validation::throughput_checks(&data.join("calibration.csv"))?;
    let splitwise =
        sim::cost_model::calibration::splitwise_measurements(&data.join("calibration.csv"))?;
    let held_out = sim::cost_model::calibration::vllm_2023_held_out(&splitwise);
    let gemm_held_out = sim::cost_model::calibration::gemm_held_out(&data)?;
    let runs = data.join("serving").join("llmservingsim");
    let mut report = replays(&runs, None, ProfileChoice::Off)?;
    report.done_profiled = replays(&runs, None, ProfileChoice::Auto)?
        .done
        .into_iter()
        .filter(|r| r.profile.is_some())
        .collect();
    report.fitted = replay_fits(&runs, ProfileChoice::Off)?;
    report.fitted_profiled = replay_fits(&runs, ProfileChoice::Auto)?;
    let fit = data.join("observed-vllm.toml");
    if fit.is_file() {
        report.done_calibrated = replays(&runs, Some(&fit), ProfileChoice::Off)?.done;
        report.calibrated_with = Some(fit.display().to_string());
    }
    let silicon = data
        .join("serving")
        .join("aiconfigurator")
        .join("silicon.csv");
    if silicon.is_file() {
        let rows = sim::observed::silicon::read(&silicon)?;
        let (checks, skipped) = sim::cost_model::validation::silicon::silicon_checks(&rows, None)?;
        let (disagg, disagg_skipped) =
            sim::cost_model::validation::disagg::disagg_checks(&rows, &|_| Default::default())?;
        if let Some(csv_path) = &silicon_csv {
            write_silicon_csv(csv_path, checks.iter().chain(&disagg))?;
        }
        report.silicon = checks;
        report.disagg = disagg;
        report.disagg_skipped = disagg_skipped;
        report.observed_fits = observed_fits(&data)?;
        report.moe_engines_held_out = held_out_rows(&data, |n| n.starts_with("observed-moe-"))?;
        report.engines_held_out = held_out_rows(&data, |n| {
            n.starts_with("observed-") && !n.starts_with("observed-moe-")
        })?;
        let served = data.join("served-closed-loop.csv");
        if served.is_file() {
            report.served = Some(
                sim::cost_model::validation::read_served_loop(&served)
                    .map_err(anyhow::Error::msg)?,
            );
        }
        report.silicon_skipped = skipped;
    }
    // The recorded `sim fidelity` runs of the CUDA runtime on lent GPUs.
    if let Ok(dir) = std::fs::read_dir(data.join("fidelity")) {
        let mut files: Vec<_> = dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "csv"))
            .collect();
        files.sort();
        for f in files {
            report.fidelity.push(
                sim::cost_model::validation::fidelity::read_recorded(&f)
                    .map_err(anyhow::Error::msg)?,
            );
        }
    }
    let text = sim::cost_model::validation::report(
        &calibration,
        &profiles,
        &throughput,
        &held_out,
        &gemm_held_out,
        &report,
    );
    std::fs::write(&path, &text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if let Some(summary) = text.split("## Summary").nth(1) {
        outln!(out, "{}", summary.trim());
    }
    outln!(out, "wrote {}", path.display());
    Ok(())
}

/// Every LLMServingSim run under `dir` (`<GPU>/<model>/`), replayed in a scratch folder that
/// is removed afterwards; runs `sim replay` cannot take yet are listed with the reason.
fn replays(
    dir: &std::path::Path,
    calibration: Option<&std::path::Path>,
    profiles: sim::replay::ProfileChoice,
) -> anyhow::Result<sim::cost_model::validation::Replays> {
    let mut out = sim::cost_model::validation::Replays::default();
    let Ok(gpus) = std::fs::read_dir(dir) else {
        return Ok(out);
    };
    let mut runs: Vec<PathBuf> = Vec::new();
    for g in gpus.flatten() {
        if let Ok(models) = std::fs::read_dir(g.path()) {
            runs.extend(
                models
                    .flatten()
                    .map(|m| m.path())
                    .filter(|p| p.join("vllm").is_dir()),
            );
        }
    }
    runs.sort();
    let scratch = std::env::temp_dir().join(format!("sim-validate-replays-{}", std::process::id()));
    for run in runs {
        let observed = sim::observed::open(&run)?;
        let opts = sim::replay::ReplayOptions {
            out_dir: scratch.join(run.file_name().unwrap_or_default()),
            calibration: calibration.map(std::path::Path::to_path_buf),
            model: None,
            gpu: None,
            gpu_file: None,
            driver: sim::driver::DriverKind::Inline,
            profiles: profiles.clone(),
        };
        match sim::replay::replay(&observed, &opts) {
            Ok(r) => out.done.push(r),
            Err(sim::replay::ReplayError::Run { message, .. }) => {
                out.skipped.push((run.display().to_string(), message));
            }
            Err(e) => return Err(e.into()),
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(out)
}

/// Every LLMServingSim run under `dir` fitted as `sim calibrate --observed` fits them (per
/// deployment, 5 folds by time), in a scratch folder that is removed afterwards.
fn replay_fits(
    dir: &std::path::Path,
    profiles: ProfileChoice,
) -> anyhow::Result<Vec<sim::cost_model::calibration::replayed::ReplayedFit>> {
    use sim::cost_model::calibration::replayed::{Deployments, FitRun};
    let mut paths = Vec::new();
    super::replay::runs_in(dir, 0, &mut paths);
    paths.sort();
    let mut groups = Deployments::new();
    for p in &paths {
        let run = sim::observed::open(p)?;
        if let (Ok(model), Ok(gpu)) = (sim::replay::model_of(&run), sim::replay::gpu_of(&run)) {
            groups.entry((model, gpu)).or_default().push(FitRun {
                name: p.strip_prefix(dir).unwrap_or(p).display().to_string(),
                run,
            });
        }
    }
    let scratch = std::env::temp_dir().join(format!("sim-validate-fits-{}", std::process::id()));
    let replay = sim::replay::ReplayOptions {
        out_dir: scratch.clone(),
        calibration: None,
        model: None,
        gpu: None,
        gpu_file: None,
        driver: sim::driver::DriverKind::Inline,
        profiles,
    };
    let fits = sim::cost_model::calibration::replayed::fit_deployments(
        &groups,
        &scratch,
        &replay,
        5,
        &toml::Table::new(),
    );
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(fits?)
}

/// One line per simulated aiconfigurator row.
fn write_silicon_csv<'a>(
    path: &std::path::Path,
    checks: impl Iterator<Item = &'a sim::cost_model::validation::silicon::SiliconCheck>,
) -> anyhow::Result<()> {
    let err = |e: csv::Error| anyhow::anyhow!("{}: {e}", path.display());
    let mut w = csv::Writer::from_path(path).map_err(err)?;
    w.write_record([
        "id",
        "mode",
        "backend",
        "gpu",
        "model",
        "quant",
        "tp",
        "isl",
        "osl",
        "concurrency",
        "measured_ttft_ms",
        "simulated_ttft_ms",
        "measured_tpot_ms",
        "simulated_tpot_ms",
    ])
    .map_err(err)?;
    for c in checks {
        let r = &c.row;
        w.write_record([
            r.id.clone(),
            r.mode.clone(),
            r.backend.clone(),
            c.gpu.to_string(),
            c.model.to_string(),
            r.gemm_quant.clone(),
            r.tp.unwrap_or(1).to_string(),
            r.isl.to_string(),
            r.osl.to_string(),
            r.concurrency.unwrap_or(1).to_string(),
            format!("{:.4}", r.ttft_ms),
            format!("{:.4}", c.ttft_ms),
            format!("{:.4}", r.tpot_ms),
            format!("{:.4}", c.tpot_ms),
        ])
        .map_err(err)?;
    }
    w.flush()
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(())
}

/// The shipped `calibration/observed-<engine>.toml` fits, each with its header comment
/// joined into one line.
fn observed_fits(data: &std::path::Path) -> anyhow::Result<Vec<(String, String)>> {
    let files = files_in(data, |n| {
        (n.starts_with("observed-") && n.ends_with(".toml"))
            || [
                "allreduce-peer.toml",
                "fp8-memory.toml",
                "fp8-gemm.toml",
                "fp4-memory.toml",
                "fp4-gemm.toml",
                "moe-gemm.toml",
                "moe-prefill.toml",
                "moe-layer.toml",
                "moe-skew.toml",
                "mtp-acceptance.toml",
                "aiperf-turnaround.toml",
                "memory-reserve.toml",
            ]
            .contains(&n)
    })?;
    let mut out = Vec::new();
    for f in files {
        let text =
            std::fs::read_to_string(&f).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?;
        let header: Vec<&str> = text
            .lines()
            .take_while(|l| l.starts_with('#'))
            .map(|l| l.trim_start_matches('#').trim())
            .collect();
        let values: Vec<String> = text
            .lines()
            .filter(|l| {
                [
                    "step_overhead_us",
                    "allreduce_latency_us",
                    "eager_layer_us",
                    "request_overhead_ms",
                    "fp8_compute_eff",
                    "allreduce_eff",
                    "allreduce_peer_us",
                    "fp4_compute_eff",
                    "fp8_memory_eff",
                    "fp4_memory_eff",
                    "moe_gemm_eff",
                    "moe_prefill_expert_us",
                    "moe_compute_eff",
                    "moe_layer_us",
                    "moe_routing_skew",
                    "runtime_overhead_gib",
                    "acceptance",
                    "[aiperf_turnaround_ms]",
                    "[cost.by_gpu.",
                ]
                .iter()
                .any(|k| l.starts_with(k))
                    // The turnaround's table: one spread per engine.
                    || (f.ends_with("aiperf-turnaround.toml")
                        && ["sglang = ", "trtllm = ", "vllm = "]
                            .iter()
                            .any(|k| l.starts_with(k)))
            })
            .map(|l| format!("`{l}`"))
            .collect();
        out.push((
            f.display().to_string(),
            // A fit that kept the defaults sets no term.
            if values.is_empty() {
                format!("no term (the defaults). {}", header.join(" "))
            } else {
                format!("{}. {}", values.join(", "), header.join(" "))
            },
        ));
    }
    Ok(out)
}

/// Every row's held-out `(TTFT, TPOT)` errors in the shipped `<name>.rows.csv` files of
/// `data` whose names `keep` takes (`observed-<engine>`, `observed-moe-<engine>`), all
/// engines together.
fn held_out_rows(
    data: &std::path::Path,
    keep: impl Fn(&str) -> bool,
) -> anyhow::Result<Vec<(f64, f64)>> {
    let files = files_in(data, |n| n.ends_with(".rows.csv") && keep(n))?;
    let mut out = Vec::new();
    for f in files {
        let mut r =
            csv::Reader::from_path(&f).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?;
        let headers = r
            .headers()
            .map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?
            .clone();
        let col = |name: &str| {
            headers
                .iter()
                .position(|h| h == name)
                .ok_or_else(|| anyhow::anyhow!("{}: no `{name}` column", f.display()))
        };
        let (t, p) = (col("ttft_error")?, col("tpot_error")?);
        for (i, rec) in r.records().enumerate() {
            let rec = rec.map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?;
            let num = |c: usize| -> anyhow::Result<f64> {
                rec.get(c).unwrap_or("").parse().map_err(|_| {
                    anyhow::anyhow!("{}: line {}: expected a number", f.display(), i + 2)
                })
            };
            out.push((num(t)?, num(p)?));
        }
    }
    Ok(out)
}

/// The files of `data` whose names `keep` takes, sorted.
fn files_in(data: &std::path::Path, keep: impl Fn(&str) -> bool) -> anyhow::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(data)
        .map_err(|e| anyhow::anyhow!("{}: {e}", data.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(&keep))
        .collect();
    files.sort();
    Ok(files)
}
