//! `sim serve`: an OpenAI-compatible server (`sim::serve`) on a scenario's variant or a
//! GGUF model, until Ctrl-C or SIGTERM; then the run's records are written as `sim run`
//! writes them and its summary printed.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use sim::run::BackendKind;
use sim::scenario::Scenario;
use sim::serve::ServeOptions;

/// Serve a scenario's model (or a GGUF model) over the OpenAI API: `/v1/completions` and
/// `/v1/chat/completions` (streamed or not), `/v1/models`, `/health`, `/tokenize`,
/// `/detokenize`, `/metrics`. Real backends (cpu, cuda) run the model; the cost model
/// (model) sends synthetic tokens when the scenario's GPU would.
#[derive(clap::Args)]
pub struct Args {
    /// A scenario TOML file, or a GGUF model file (served alone, on the CPU runtime by
    /// default).
    pub target: PathBuf,
    /// Backend that executes the steps (default: cpu for a GGUF file, model for a
    /// scenario).
    #[arg(long, value_enum)]
    pub backend: Option<BackendKind>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The cost model's time runs this many times faster than the wall clock
    /// (--backend model only).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// The scenario's variant to serve (default: its first).
    #[arg(long)]
    pub variant: Option<String>,
    /// Where the records go (default: results/serve-<scenario name>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The model's name in the API (default: the GGUF file's stem, or the scenario's
    /// model).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Most requests in flight; more are answered 429.
    #[arg(long, default_value_t = 256)]
    pub max_concurrency: usize,
    /// With a GGUF file: the GPU the cost model simulates (--backend model).
    #[arg(long, default_value = "h100-sxm")]
    pub gpu: String,
    /// With a GGUF file: the engine's context limit (default: the model's).
    #[arg(long)]
    pub max_model_len: Option<u32>,
    /// A calibration file (a `sim calibrate` output) for the cost model.
    #[arg(long)]
    pub calibration: Option<PathBuf>,
}

fn is_gguf(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// Runs `sim serve`, printing the run's summary into `out` once it stops.
pub fn run(args: Args, out: &mut String) -> anyhow::Result<()> {
    let gguf = is_gguf(&args.target);
    if !gguf && (args.max_model_len.is_some() || args.gpu != "h100-sxm") {
        anyhow::bail!(
            "--gpu/--max-model-len: only with a GGUF file; a scenario sets hardware.gpu and engine.max_model_len"
        );
    }
    if args.max_concurrency == 0 {
        anyhow::bail!("--max-concurrency: must be at least 1");
    }
    let scn = if gguf {
        sim::serve::gguf_scenario(
            &args.target,
            &args.gpu,
            args.max_model_len,
            args.calibration.as_deref(),
        )?
    } else {
        match &args.calibration {
            Some(c) => Scenario::load_calibrated(&args.target, None, c)?,
            None => Scenario::load(&args.target, None)?,
        }
    };
    let backend = args.backend.unwrap_or(if gguf {
        BackendKind::Cpu
    } else {
        BackendKind::Model
    });
    let variant = match &args.variant {
        Some(name) => scn
            .variants
            .iter()
            .find(|v| &v.name == name)
            .ok_or_else(|| {
                let names: Vec<&str> = scn.variants.iter().map(|v| v.name.as_str()).collect();
                anyhow::anyhow!(
                    "--variant: no variant named `{name}` (variants: {})",
                    names.join(", ")
                )
            })?,
        None => &scn.variants[0],
    }
    .clone();
    let model_name = args.served_model_name.clone().unwrap_or_else(|| {
        if gguf {
            args.target
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default()
        } else {
            variant.deployment.model.name.to_string()
        }
    });
    let folder = if scn.name.starts_with("serve-") {
        scn.name.clone()
    } else {
        format!("serve-{}", scn.name)
    };
    let out_dir = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("results").join(folder));
    let server = sim::serve::start(
        &scn,
        ServeOptions {
            variant,
            backend,
            addr: SocketAddr::new(args.host, args.port),
            time_scale: args.time_scale,
            out_dir: Some(out_dir.clone()),
            model_name: model_name.clone(),
            max_concurrency: args.max_concurrency,
            handle_signals: true,
        },
    )?;
    // Printed now (the rest of the output comes when the server stops).
    eprintln!(
        "serving `{model_name}` ({:?} backend) on http://{} (Ctrl-C to stop; records in {})",
        backend,
        server.addr(),
        out_dir.display()
    );
    let summary = server.wait()?;
    if summary.num_aborted > 0 {
        outln!(
            out,
            "{} requests were aborted (their clients hung up, or the server stopped): they are left out of the figures below",
            summary.num_aborted
        );
    }
    outln!(out, "{}", analysis::comparison_table(&[summary]));
    outln!(out, "records in {}", out_dir.display());
    Ok(())
}
