//! `sim replay`: a real engine's run replayed through the simulator (its deployment, its
//! KV blocks, exactly its requests at their send times), measured against simulated; a
//! folder of runs gives one row per run and the medians of the errors.

use std::path::{Path, PathBuf};

use sim::driver::DriverKind;
use sim::replay::{replay, ProfileChoice, Replay, ReplayError, ReplayOptions};

/// Replay a real engine's run and compare measured with simulated latencies.
///
/// RUN is an LLMServingSim run directory (vllm/meta.json + vllm/requests.jsonl), a `vllm
/// bench serve --save-result --save-detailed` JSON (vLLM 0.15 or later, for the send
/// times), an aiperf artifact folder or its profile_export.jsonl, a BLIS TraceV2 CSV, or
/// sim's plain run CSV (send_s, prompt_len, output_len, ttft_ms, e2el_ms). A folder holding
/// such runs (LLMServingSim's `<GPU>/<model>/` layout included) replays each, one row per
/// run, with the medians of the errors.
#[derive(clap::Args)]
pub struct Args {
    /// The run, or a folder of runs.
    pub run: PathBuf,
    /// Output folder (default: results/replay-<run name>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// A `sim calibrate` output whose [cost] the replay uses.
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// Catalog model to replay on, instead of the one the run names.
    #[arg(long)]
    pub model: Option<String>,
    /// Catalog GPU to replay on, instead of the one the run names.
    #[arg(long)]
    pub gpu: Option<String>,
    /// A hardware file to replay on instead: a GPU's TOML (as `hardware.gpu_file`), or
    /// the CPU profile `sim calibrate --observed` fitted to a served run.
    #[arg(long, conflicts_with = "gpu")]
    pub gpu_file: Option<PathBuf>,
    /// Driver.
    #[arg(long, value_enum, default_value = "inline")]
    pub driver: DriverKind,
    /// Price steps from this operator profile (LLMServingSim's profiler: a folder with
    /// meta.yaml and tp<N>/, or a folder in its layout <GPU>/<model id>/<variant>/). By
    /// default an LLMServingSim run uses the profile beside it (profiles/<GPU>/<model>/)
    /// when there is one.
    #[arg(long, conflicts_with = "no_profiles")]
    pub profiles: Option<PathBuf>,
    /// Price steps on the roofline even where an operator profile exists.
    #[arg(long)]
    pub no_profiles: bool,
}

/// The runs under `dir`: LLMServingSim run folders, aiperf artifact folders, runs `sim`
/// wrote and run files, down to two folders deep (LLMServingSim's `<GPU>/<model>/`),
/// sorted.
pub(crate) fn runs_in(dir: &Path, depth: u32, runs: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for p in entries.flatten().map(|e| e.path()) {
        if p.join("vllm").join("meta.json").is_file()
            || sim::observed::is_aiperf_run(&p)
            || sim::observed::sim_run::is_sim_run(&p)
            || p.extension()
                .is_some_and(|x| x == "json" || x == "jsonl" || x == "csv")
        {
            runs.push(p);
        } else if p.is_dir() && depth < 2 {
            runs_in(&p, depth + 1, runs);
        }
    }
}

/// Runs `sim replay`, printing into `out`.
pub fn run(args: Args, out: &mut String) -> anyhow::Result<()> {
    let name = sim::replay::run_name(&args.run);
    let out_dir = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("results").join(format!("replay-{name}")));
    let opts = |dir: PathBuf| ReplayOptions {
        out_dir: dir,
        calibration: args.calibration.clone(),
        model: args.model.clone(),
        gpu: args.gpu.clone(),
        gpu_file: args.gpu_file.clone(),
        driver: args.driver,
        profiles: match (&args.profiles, args.no_profiles) {
            (_, true) => ProfileChoice::Off,
            (Some(p), false) => ProfileChoice::From(p.clone()),
            (None, false) => ProfileChoice::Auto,
        },
    };
    let is_folder = args.run.is_dir()
        && !args.run.join("vllm").join("meta.json").is_file()
        && !sim::observed::is_aiperf_run(&args.run)
        && !sim::observed::sim_run::is_sim_run(&args.run);
    if !is_folder {
        let observed = sim::observed::open(&args.run)?;
        let r = replay(&observed, &opts(out_dir.clone()))?;
        out.push_str(&r.table());
        outln!(
            out,
            "results in {} (replay.csv, replay.html, replay.toml, its trace, sim/)",
            out_dir.display()
        );
        return Ok(());
    }
    let mut runs = Vec::new();
    runs_in(&args.run, 0, &mut runs);
    runs.sort();
    if runs.is_empty() {
        anyhow::bail!(
            "{}: no runs found (LLMServingSim run folders, .json or .csv runs)",
            args.run.display()
        );
    }
    let mut done: Vec<(String, String, Replay)> = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    for run in &runs {
        let rel = run
            .strip_prefix(&args.run)
            .unwrap_or(run)
            .display()
            .to_string();
        let observed = match sim::observed::open(run) {
            Ok(o) => o,
            Err(e) => {
                skipped.push(format!("{rel}: {e}"));
                continue;
            }
        };
        let name = sim::replay::run_name(Path::new(&rel.replace('/', "-")));
        match replay(&observed, &opts(out_dir.join(&name))) {
            Ok(r) => done.push((rel, name, r)),
            Err(ReplayError::Run { message, .. }) => skipped.push(format!("{rel}: {message}")),
            Err(e) => return Err(e.into()),
        }
    }
    if done.is_empty() {
        anyhow::bail!(
            "{}: no run replayed: {} found, all skipped (first: {})",
            args.run.display(),
            runs.len(),
            skipped.first().map_or("none", String::as_str)
        );
    }
    for s in &skipped {
        outln!(out, "skipped {s}");
    }
    let metrics = [
        "ttft_mean_ms",
        "ttft_p50_ms",
        "ttft_p90_ms",
        "tpot_mean_ms",
        "e2el_mean_ms",
        "throughput_rps",
    ];
    let mut csv = format!(
        "run,deployment,{}\n",
        metrics.map(|m| format!("{m}_error_pct")).join(",")
    );
    outln!(
        out,
        "{:<40} {}",
        "run (error of the simulation)",
        metrics.map(|m| format!("{m:>15}")).join("")
    );
    let err = |r: &Replay, m: &str| r.figure(m).and_then(|f| f.error_pct());
    for (rel, _, r) in &done {
        let cells: Vec<String> = metrics
            .iter()
            .map(|m| err(r, m).map_or_else(|| "-".into(), |e| format!("{e:+.1}%")))
            .collect();
        outln!(
            out,
            "{:<40} {}",
            rel,
            cells.iter().map(|c| format!("{c:>15}")).collect::<String>()
        );
        let raw: Vec<String> = metrics
            .iter()
            .map(|m| err(r, m).map_or(String::new(), |e| format!("{e:.3}")))
            .collect();
        csv.push_str(&format!("{rel},{},{}\n", r.deployment, raw.join(",")));
    }
    let medians: Vec<String> = metrics
        .iter()
        .map(|m| {
            let v: Vec<f64> = done.iter().filter_map(|(_, _, r)| err(r, m)).collect();
            if v.is_empty() {
                "-".into()
            } else {
                format!("{:+.1}%", analysis::median(&v))
            }
        })
        .collect();
    outln!(
        out,
        "{:<40} {}",
        "median",
        medians
            .iter()
            .map(|c| format!("{c:>15}"))
            .collect::<String>()
    );
    std::fs::create_dir_all(&out_dir).map_err(|e| anyhow::anyhow!("{}: {e}", out_dir.display()))?;
    let path = out_dir.join("runs.csv");
    std::fs::write(&path, csv).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let rows: Vec<(String, String, &Replay)> = done
        .iter()
        .map(|(rel, name, r)| (rel.clone(), name.clone(), r))
        .collect();
    let page = out_dir.join("index.html");
    std::fs::write(&page, sim::replay::folder_html(&rows, &metrics))
        .map_err(|e| anyhow::anyhow!("{}: {e}", page.display()))?;
    outln!(
        out,
        "{} runs replayed; results in {} (runs.csv, index.html, one folder per run)",
        done.len(),
        out_dir.display()
    );
    Ok(())
}
