//! `sim replay`: a real engine's run replayed through the simulator (its deployment, its
//! KV blocks, exactly its requests at their send times), measured against simulated.

use std::path::PathBuf;

use sim::driver::DriverKind;
use sim::replay::{replay, ReplayOptions};

/// Replay a real engine's run and compare measured with simulated latencies.
///
/// RUN is an LLMServingSim run directory (vllm/meta.json + vllm/requests.jsonl), a `vllm
/// bench serve --save-result --save-detailed` JSON (vLLM 0.15 or later, for the send
/// times), a BLIS TraceV2 CSV, or sim's plain run CSV (send_s, prompt_len, output_len,
/// ttft_ms, e2el_ms).
#[derive(clap::Args)]
pub struct Args {
    /// The run.
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
    /// Driver.
    #[arg(long, value_enum, default_value = "inline")]
    pub driver: DriverKind,
}

/// Runs `sim replay`, printing into `out`.
pub fn run(args: Args, out: &mut String) -> anyhow::Result<()> {
    let observed = sim::observed::open(&args.run)?;
    let name = sim::replay::run_name(&args.run);
    let out_dir = args
        .out
        .unwrap_or_else(|| PathBuf::from("results").join(format!("replay-{name}")));
    let opts = ReplayOptions {
        out_dir: out_dir.clone(),
        calibration: args.calibration,
        model: args.model,
        gpu: args.gpu,
        driver: args.driver,
    };
    let r = replay(&observed, &opts)?;
    out.push_str(&r.table());
    outln!(
        out,
        "results in {} (replay.csv, replay.toml, trace.csv, sim/)",
        out_dir.display()
    );
    Ok(())
}
