//! The `sim` command line: run, validate and inspect serving scenarios.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use sim::catalog::{GPUS, MODELS};
use sim::driver::DriverKind;
use sim::run::{run_scenario, RunOptions};
use sim::scenario::Scenario;

/// Actor-based discrete-event simulator of LLM inference serving.
#[derive(Parser)]
#[command(name = "sim", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Execution backend of the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendKind {
    /// The roofline cost model of the scenario's GPUs (no GPU needed).
    Model,
}

#[derive(Subcommand)]
enum Command {
    /// Run every variant of a scenario and compare them.
    Run {
        /// Scenario TOML file.
        scenario: PathBuf,
        /// Output folder (default: results/<scenario name>).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Seed of the workload's random streams (default: the scenario's `seed`).
        #[arg(long)]
        seed: Option<u64>,
        /// Backend that executes the steps.
        #[arg(long, value_enum, default_value_t = BackendKind::Model)]
        backend: BackendKind,
        /// Driver: actix actors (default) or the inline loop (same results, faster).
        #[arg(long, value_enum, default_value_t = DriverKind::Actors)]
        driver: DriverKind,
        /// Run only this variant (repeatable).
        #[arg(long = "variant")]
        variants: Vec<String>,
        /// Hide the progress bar.
        #[arg(long)]
        quiet: bool,
    },
    /// Parse a scenario and print each variant's memory plan without running it.
    Validate {
        /// Scenario TOML file.
        scenario: PathBuf,
    },
    /// Time a scenario's variants (one after another, nothing written): simulated
    /// requests per wall second, steps per second, peak memory.
    Bench {
        /// Scenario TOML file.
        scenario: PathBuf,
        /// Override the workload's request count.
        #[arg(long)]
        requests: Option<u64>,
        /// Driver.
        #[arg(long, value_enum, default_value_t = DriverKind::Actors)]
        driver: DriverKind,
        /// Run only this variant (repeatable).
        #[arg(long = "variant")]
        variants: Vec<String>,
    },
    /// List the model catalog.
    Models,
    /// List the GPU catalog.
    Gpus,
}

/// Appends a formatted line to the output buffer (printed at the end, so a closed pipe
/// such as `sim run ... | head` never makes printing panic).
macro_rules! outln {
    ($out:expr) => {
        $out.push('\n')
    };
    ($out:expr, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($out, $($arg)*);
    }};
}

fn gb(bytes: f64) -> String {
    format!("{:.2} GB", bytes / 1e9)
}

fn print_plan(out: &mut String, scenario: &Scenario) {
    outln!(
        out,
        "scenario `{}` ({})",
        scenario.name,
        scenario.path.display()
    );
    for v in &scenario.variants {
        let d = &v.deployment;
        let m = &v.memory;
        outln!(out);
        outln!(out, "variant `{}`", v.name);
        outln!(
            out,
            "  model            {} ({:.2} B params), weights {}, KV cache {}",
            d.model.name,
            d.model.params() / 1e9,
            d.dtype.as_str(),
            d.kv_dtype.as_str()
        );
        outln!(
            out,
            "  hardware         {} x {} ({:.1} GB each), tp = {}",
            d.tp,
            d.gpu.name,
            d.gpu.mem_bytes / 1e9,
            d.tp
        );
        outln!(
            out,
            "  usable memory    {} ({} x gpu_memory_utilization {})",
            gb(m.gpu_mem_bytes * m.gpu_memory_utilization),
            gb(m.gpu_mem_bytes),
            m.gpu_memory_utilization
        );
        outln!(out, "  weights / GPU    {}", gb(m.weight_bytes));
        outln!(out, "  activations      {}", gb(m.activation_bytes));
        outln!(out, "  runtime overhead {}", gb(m.runtime_overhead_bytes));
        outln!(out, "  KV budget        {}", gb(m.kv_budget_bytes));
        outln!(
            out,
            "  KV per token     {} bytes / GPU ({} layers x {} KV heads x {} head dim x 2 x {} B)",
            m.kv_bytes_per_token,
            d.model.layers,
            d.kv_heads_per_gpu(),
            d.model.head_dim,
            d.kv_dtype.bytes()
        );
        outln!(
            out,
            "  KV pool          {} blocks x {} tokens = {} tokens ({} bytes per block)",
            m.num_blocks,
            m.block_size,
            m.pool_tokens,
            m.block_bytes
        );
        outln!(
            out,
            "  max concurrency  {:.2} sequences of max_model_len {}",
            m.max_concurrency_at_max_len,
            m.max_model_len
        );
        let s = &v.scheduler;
        outln!(
            out,
            "  scheduler        {} (max_num_seqs {}, max_num_batched_tokens {})",
            s.kind.as_str(),
            s.max_num_seqs,
            s.max_num_batched_tokens
        );
    }
}

fn run(cli: Cli, out: &mut String) -> anyhow::Result<()> {
    match cli.command {
        Command::Run {
            scenario,
            out: out_dir,
            seed,
            backend,
            driver,
            variants,
            quiet,
        } => {
            let BackendKind::Model = backend;
            let scn = Scenario::load(&scenario, seed)?;
            let out_dir = out_dir.unwrap_or_else(|| PathBuf::from("results").join(&scn.name));
            let opts = RunOptions {
                out_dir: Some(out_dir.clone()),
                driver,
                only: variants,
                progress: !quiet,
                parallel: true,
            };
            let results = run_scenario(&scn, &opts)?;
            let summaries: Vec<_> = results.iter().map(|r| r.summary.clone()).collect();
            outln!(
                out,
                "scenario `{}`: {} variants, seed {}, backend model",
                scn.name,
                summaries.len(),
                scn.seed
            );
            outln!(out, "{}", analysis::comparison_table(&summaries));
            for r in &results {
                for w in &r.warnings {
                    outln!(out, "warning: {w}");
                }
            }
            outln!(out, "results in {}", out_dir.display());
            Ok(())
        }
        Command::Validate { scenario } => {
            let scn = Scenario::load(&scenario, None)?;
            print_plan(out, &scn);
            outln!(out);
            outln!(out, "ok: {} variant(s) fit", scn.variants.len());
            Ok(())
        }
        Command::Bench {
            scenario,
            requests,
            driver,
            variants,
        } => {
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
        Command::Models => {
            outln!(
                out,
                "{:<14} {:>8} {:>6} {:>6} {:>9} {:>8} {:>10} {:>12}  hf id",
                "name",
                "params",
                "layers",
                "hidden",
                "heads/kv",
                "context",
                "bf16 GB",
                "KV B/token"
            );
            for m in MODELS {
                let kv = 2.0 * f64::from(m.layers * m.kv_heads * m.head_dim) * 2.0;
                outln!(
                    out,
                    "{:<14} {:>7.2}B {:>6} {:>6} {:>9} {:>8} {:>10.1} {:>12}  {}",
                    m.name,
                    m.params() / 1e9,
                    m.layers,
                    m.hidden,
                    format!("{}/{}", m.heads, m.kv_heads),
                    m.max_position,
                    m.params() * 2.0 / 1e9,
                    kv,
                    m.hf_id
                );
            }
            Ok(())
        }
        Command::Gpus => {
            outln!(
                out,
                "{:<15} {:>8} {:>11} {:>10} {:>9} {:>11}  name",
                "key",
                "mem GB",
                "bf16 TF/s",
                "fp8 TF/s",
                "HBM TB/s",
                "link GB/s"
            );
            for g in GPUS {
                outln!(
                    out,
                    "{:<15} {:>8.1} {:>11.1} {:>10} {:>9.3} {:>11.0}  {}",
                    g.name,
                    g.mem_bytes / 1e9,
                    g.flops_16 / 1e12,
                    g.flops_fp8
                        .map_or("-".to_string(), |f| format!("{:.1}", f / 1e12)),
                    g.mem_bw / 1e12,
                    g.link_bw / 1e9,
                    g.display
                );
            }
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut out = String::new();
    let result = run(cli, &mut out);
    // A reader that went away (a closed pipe) is not an error of ours.
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), out.as_bytes());
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the cause chain, skipping causes the outer message already quotes.
            let mut line = String::new();
            for cause in e.chain() {
                let text = cause.to_string().replace('\n', " ");
                if !line.contains(&text) {
                    if !line.is_empty() {
                        line.push_str(": ");
                    }
                    line.push_str(&text);
                }
            }
            eprintln!("error: {line}");
            ExitCode::from(2)
        }
    }
}
