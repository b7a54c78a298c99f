//! The `sim` command line: run, validate and inspect serving scenarios.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sim::catalog::{GPUS, MODELS};
use sim::driver::DriverKind;
use sim::run::{run_scenario, BackendKind, RunOptions};
use sim::scenario::Scenario;

/// Actor-based discrete-event simulator of LLM inference serving.
#[derive(Parser)]
#[command(name = "sim", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
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
        /// Override the workload's request count (e.g. to fit a GPU session).
        #[arg(long)]
        requests: Option<u64>,
        /// Hide the progress bar.
        #[arg(long)]
        quiet: bool,
        /// A calibration file (a `sim calibrate` output) for the cost model, as if the
        /// scenario's `[cost]` had `calibration = FILE` (its own keys still win).
        #[arg(long)]
        calibration: Option<PathBuf>,
        /// Replicas: run the scenario with N seeds (from --seed or the scenario's), each
        /// into `<out>/seed-<s>/`, and report every metric's mean with a 95% interval.
        #[arg(long, default_value_t = 1)]
        seeds: u32,
        /// Run one N-th of a sweep's runs (`i/N`, from 0/N; e.g. one task of a Slurm
        /// array): every run whose index is i modulo N. `sim merge` joins the shards.
        #[arg(long)]
        shard: Option<sim::sweep::Shard>,
    },
    /// Measure speculative decoding on a real GGUF model (the CPU runtime, greedy): each
    /// prompt decoded plainly and speculatively, outputs checked identical, acceptance
    /// and speeds reported, with the per-position rates as a scenario's `acceptance`.
    Speculate {
        /// The GGUF model file.
        #[arg(long)]
        model: PathBuf,
        /// A prompt (repeatable; default: the 12 prompts of llama.cpp's oracle).
        #[arg(long = "prompt")]
        prompts: Vec<String>,
        /// Send each prompt through the model's chat template.
        #[arg(long)]
        chat: bool,
        /// Draft method: `ngram` (prompt lookup by the engine) or `self` (the model's
        /// first --draft-layers layers).
        #[arg(long, default_value = "ngram")]
        method: String,
        /// Drafts per verify step.
        #[arg(long, default_value_t = 4)]
        k: u32,
        /// Layers of the self-speculation draft (`--method self`).
        #[arg(long, default_value_t = 20)]
        draft_layers: usize,
        /// Shortest and longest n-gram (`--method ngram`).
        #[arg(long, default_value_t = 1)]
        min_n: u32,
        /// Longest n-gram.
        #[arg(long, default_value_t = 4)]
        max_n: u32,
        /// Tokens generated per prompt (generation also stops at end-of-sequence).
        #[arg(long, default_value_t = 64)]
        max_tokens: u32,
    },
    /// Compare two result sets (run folders, or folders of `--seeds` replicas): per
    /// variant and metric, both means with 95% intervals, the change and Welch's p-value.
    Compare {
        /// The reference results.
        a: PathBuf,
        /// The results compared with them.
        b: PathBuf,
        /// Also write the comparison as CSV here.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Rebuild `report.html` of a results folder (a run's or a sweep's) from its files.
    Report {
        /// The folder `sim run` wrote.
        dir: PathBuf,
    },
    /// Join the output folders of a sharded sweep (`sim run --shard i/N`) into one result
    /// set, identical to an unsharded run's.
    Merge {
        /// The shards' output folders.
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        /// Where the merged results go.
        #[arg(long)]
        out: PathBuf,
    },
    /// Generate a completion with a real GGUF model (e.g. SmolLM2-135M-Instruct Q4_1): the
    /// prompt goes through the model's tokenizer (and chat template with --chat); the text
    /// streams to stdout, the token counts and speeds follow.
    Generate {
        /// The GGUF model file.
        #[arg(long)]
        model: PathBuf,
        /// The prompt.
        #[arg(long)]
        prompt: String,
        /// Send the prompt as a user message through the model's chat template.
        #[arg(long)]
        chat: bool,
        /// A system message (with --chat; default: the template's own).
        #[arg(long)]
        system: Option<String>,
        /// Most tokens to generate (generation also stops at end-of-sequence).
        #[arg(long, default_value_t = 128)]
        max_tokens: u32,
        /// Sampling temperature (0: greedy).
        #[arg(long, default_value_t = 0.0)]
        temperature: f32,
        /// Top-k cut (0: none).
        #[arg(long, default_value_t = 0)]
        top_k: u32,
        /// Top-p cut in (0, 1] (1: none).
        #[arg(long, default_value_t = 1.0)]
        top_p: f32,
        /// Seed of the draws.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Backend that runs the model: cpu (the reference runtime) or cuda.
        #[arg(long, value_enum, default_value_t = BackendKind::Cpu)]
        backend: BackendKind,
        /// Print the prompt's and the completion's token ids too.
        #[arg(long)]
        ids: bool,
    },
    /// Report the GPU, driver, compute capability, memory, and whether NVRTC and cuBLAS
    /// load and the kernels compile.
    Doctor,
    /// Check the CUDA paged-attention kernel against a float64 reference on random inputs.
    CudaCheck {
        /// Seed of the random inputs.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Run a llama.cpp oracle file's prompts through the CUDA runtime with a real GGUF
    /// model and compare the greedy tokens and top logits.
    CudaOracle {
        /// The GGUF model (SmolLM2-135M-Instruct Q4_1 for the shipped oracle).
        #[arg(long)]
        model: PathBuf,
        /// The oracle JSON.
        #[arg(long, default_value = "tests/data/oracle/smollm2_q4_1_llamacpp.json")]
        oracle: PathBuf,
    },
    /// Time the CPU runtime on a GGUF model: a prefill, and decode steps of 1, 8, 16 and
    /// 32 sequences (aggregate tokens/s).
    CpuBench {
        /// The GGUF model file.
        #[arg(long)]
        model: PathBuf,
        /// Prompt length, and the decodes' context.
        #[arg(long, default_value_t = 128)]
        prompt: u32,
        /// Timed steps per line (the median is reported).
        #[arg(long, default_value_t = 5)]
        reps: usize,
    },
    /// Measure the GPU's ceilings and the CUDA runtime against them (synthetic weights).
    CudaBench {
        /// Catalog model whose shape is timed.
        #[arg(long, default_value = "llama-3-8b")]
        model: String,
        /// KV block size.
        #[arg(long, default_value_t = 16)]
        block_size: u32,
    },
    /// Parse a scenario and print each variant's memory plan without running it.
    Validate {
        /// Scenario TOML file.
        scenario: PathBuf,
    },
    /// Compare the cost model with every row of calibration/calibration.csv and Vidur's
    /// operator profiles, and write the table (VALIDATION.md).
    ValidateModel {
        /// Folder with calibration.csv and the vidur_*.csv profiles.
        #[arg(long, default_value = "calibration")]
        data: PathBuf,
        /// Markdown file to write.
        #[arg(long, default_value = "VALIDATION.md")]
        out: PathBuf,
    },
    /// Capacity planning: the highest request rate one replica sustains under the
    /// scenario's SLO (p90 TTFT <= slo.ttft_ms, p99 TPOT <= slo.tpot_ms), for each GPU x TP
    /// x weight format; the replicas a target rate needs and the cost per million tokens.
    Plan {
        /// Scenario TOML file (its base configuration: model, engine, workload, SLO).
        scenario: PathBuf,
        /// Target request rate, req/s.
        #[arg(long)]
        rate: f64,
        /// GPUs to compare (repeatable; default: the scenario's).
        #[arg(long = "gpu")]
        gpus: Vec<String>,
        /// Tensor-parallel degrees (repeatable; default: the scenario's).
        #[arg(long = "tp")]
        tps: Vec<u32>,
        /// Weight formats (repeatable; default: the scenario's).
        #[arg(long = "dtype")]
        dtypes: Vec<String>,
        /// Requests simulated per probed rate.
        #[arg(long, default_value_t = 400)]
        requests: u64,
        /// Price override, GPU=USD per GPU-hour (repeatable).
        #[arg(long = "price")]
        prices: Vec<String>,
    },
    /// Fit the cost model's GEMM efficiencies and the GPUs' all-reduce figures to Vidur's
    /// operator profiles (a folder), or the GEMM efficiencies to measured GEMMs (a CSV with
    /// columns gpu,m,k,n,ms); print and write them as a `[cost]` TOML.
    Calibrate {
        /// Folder with the vidur_*.csv profiles, or a CSV of measured GEMMs.
        #[arg(long, default_value = "calibration")]
        from: PathBuf,
        /// TOML file to write (default: calibration/fitted.toml; with --backend cuda or
        /// --steps, calibration/<gpu>-cuda.toml).
        #[arg(long)]
        out: Option<PathBuf>,
        /// `cuda`: measure whole forward steps of the CUDA runtime on this machine's GPU
        /// (synthetic weights of --model) and fit the cost model to them; writes the
        /// measurements beside --out (`.steps.csv`).
        #[arg(long, value_enum)]
        backend: Option<BackendKind>,
        /// The model shape to measure or fit (a catalog name).
        #[arg(long, default_value = "llama-3-8b")]
        model: String,
        /// Fit again from recorded step measurements (`batch,ctx,tokens,ms`, as
        /// --backend cuda writes them), without a GPU.
        #[arg(long)]
        steps: Option<PathBuf>,
        /// The GPU the steps run or ran on (catalog name): required with --steps; with
        /// --backend cuda it defaults to the catalog entry of the device found.
        #[arg(long)]
        gpu: Option<String>,
    },
    /// The cost model against a real backend on one scenario: both runs with the same
    /// seed, per variant and metric the simulated value, the measured one and the error
    /// (TTFT, TPOT, E2EL at p50/p90/p99, throughput, step-time percentiles); written as
    /// `fidelity.csv` too.
    Fidelity {
        /// Scenario TOML file.
        scenario: PathBuf,
        /// The calibration the cost model runs with (a `sim calibrate` output).
        #[arg(long)]
        calibration: PathBuf,
        /// The measured side (cuda: the GPU; cpu: the CPU runtime).
        #[arg(long, value_enum, default_value_t = BackendKind::Cuda)]
        backend: BackendKind,
        /// Override the workload's request count (e.g. to fit a GPU session).
        #[arg(long)]
        requests: Option<u64>,
        /// Output folder (default: results/<scenario>-fidelity).
        #[arg(long)]
        out: Option<PathBuf>,
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
        let moe = if d.model.is_moe() {
            format!(
                ", {:.2} B active: {} of {} experts",
                d.model.active_params() / 1e9,
                d.model.experts_per_token,
                d.model.num_experts
            )
        } else {
            String::new()
        };
        outln!(
            out,
            "  model            {} ({:.2} B params{moe}), weights {}, KV cache {}",
            d.model.name,
            d.model.params() / 1e9,
            d.dtype.as_str(),
            d.kv_dtype.as_str()
        );
        outln!(
            out,
            "  hardware         {} x {} ({:.1} GB each), tp = {}, pp = {}",
            d.num_gpus(),
            d.gpu.name,
            d.gpu.mem_bytes / 1e9,
            d.tp,
            d.pp
        );
        if d.pp > 1 {
            outln!(
                out,
                "  pipeline         {} stages of up to {} layers; one batch at a time, so each GPU idles {:.0}% of a step (the bubble)",
                d.pp,
                d.layers_per_stage(),
                100.0 * f64::from(d.pp - 1) / f64::from(d.pp)
            );
        }
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
        if m.num_cpu_blocks > 0 || m.swap_bytes > 0.0 {
            outln!(
                out,
                "  CPU swap pool    {} blocks = {} tokens ({} of swap space / GPU)",
                m.num_cpu_blocks,
                u64::from(m.num_cpu_blocks) * u64::from(m.block_size),
                gb(m.swap_bytes)
            );
        }
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

/// `sim run` of a scenario with a `[sweep]`: every point crossed with the variants, a
/// compact table of the runs, and the speedup map when variants speculate.
fn run_sweep_command(
    scn: &Scenario,
    opts: &RunOptions,
    shard: Option<sim::sweep::Shard>,
    file: &std::path::Path,
    out_dir: &std::path::Path,
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

fn run(cli: Cli, out: &mut String) -> anyhow::Result<()> {
    match cli.command {
        Command::Speculate {
            model,
            prompts,
            chat,
            method,
            k,
            draft_layers,
            min_n,
            max_n,
            max_tokens,
        } => {
            if max_tokens == 0 {
                anyhow::bail!("--max-tokens: must be at least 1");
            }
            let (m, layers) = match method.as_str() {
                "ngram" => (engine::spec::Method::Ngram, None),
                "self" => (engine::spec::Method::DraftModel, Some(draft_layers)),
                other => anyhow::bail!("--method: `{other}` is not ngram or self"),
            };
            let spec = sim::speculate::greedy_spec(m, k, min_n, max_n)
                .map_err(|e| anyhow::anyhow!("--k/--min-n/--max-n: {e}"))?;
            let gguf = kernels::gguf::Gguf::open(&model)?;
            let tok = kernels::tokenizer::Tokenizer::from_gguf(&gguf)?;
            let layers_in_model = gguf.meta_u32("llama.block_count").unwrap_or(0) as usize;
            if let Some(l) = layers {
                if l == 0 || l >= layers_in_model {
                    anyhow::bail!(
                        "--draft-layers: must be from 1 to {} (the model has {layers_in_model} layers), got {l}",
                        layers_in_model.saturating_sub(1)
                    );
                }
            }
            let ids: Vec<Vec<u32>> = if prompts.is_empty() {
                kernels::oracle::smollm2()
                    .into_iter()
                    .map(|c| c.prompt_ids)
                    .collect()
            } else {
                prompts
                    .into_iter()
                    .map(|p| {
                        let text = if chat {
                            tok.apply_chat_template(
                                &[kernels::tokenizer::Message {
                                    role: "user".into(),
                                    content: p,
                                }],
                                true,
                            )?
                        } else {
                            p
                        };
                        let mut v = Vec::new();
                        if tok.add_bos {
                            v.extend(tok.bos);
                        }
                        v.extend(tok.encode(&text, true));
                        Ok::<_, anyhow::Error>(v)
                    })
                    .collect::<Result<_, _>>()?
            };
            if ids.iter().any(Vec::is_empty) {
                anyhow::bail!("--prompt: a prompt has no tokens");
            }
            let measured = sim::speculate::measure(&gguf, &ids, max_tokens, tok.eos, spec, layers)
                .map_err(|e| anyhow::anyhow!("{}: {e}", model.display()))?;
            let name = match layers {
                Some(l) => format!("self-speculation ({l} layers)"),
                None => format!("n-gram ({min_n}-{max_n})"),
            };
            out.push_str(&sim::speculate::report(&measured, &name, k));
            Ok(())
        }
        Command::Merge { dirs, out: to } => {
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
        Command::Compare { a, b, out: csv_out } => {
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
        Command::Report { dir } => {
            let report = analysis::report::write_reports(&dir)?;
            outln!(out, "wrote {}", report.display());
            Ok(())
        }
        Command::Run {
            scenario,
            out: out_dir,
            seed,
            backend,
            driver,
            variants,
            requests,
            quiet,
            shard,
            seeds,
            calibration,
        } => {
            if requests == Some(0) {
                anyhow::bail!("--requests: must be at least 1");
            }
            if seeds == 0 {
                anyhow::bail!("--seeds: must be at least 1");
            }
            let load = |seed: Option<u64>| match &calibration {
                Some(c) => Scenario::load_calibrated(&scenario, seed, c),
                None => Scenario::load(&scenario, seed),
            };
            let scn = load(seed)?;
            let out_dir = out_dir.unwrap_or_else(|| PathBuf::from("results").join(&scn.name));
            if seeds > 1 {
                if !scn.sweep.is_empty() || shard.is_some() {
                    anyhow::bail!("--seeds: replicas of a sweep are not supported; sweep `seed` instead ([sweep] seed = [1, 2, 3])");
                }
                let first = scn.seed;
                let mut dirs = Vec::new();
                for s in first..first + u64::from(seeds) {
                    let replica = load(Some(s))?;
                    let dir = out_dir.join(format!("seed-{s}"));
                    let opts = RunOptions {
                        out_dir: Some(dir.clone()),
                        driver,
                        only: variants.clone(),
                        progress: !quiet,
                        parallel: true,
                        backend,
                        requests,
                    };
                    run_scenario(&replica, &opts).map_err(|e| match e {
                        sim::SimError::Scenario(_) => anyhow::Error::from(e),
                        other => anyhow::anyhow!("{}: seed {s}: {other}", scenario.display()),
                    })?;
                    analysis::report::write_reports(&dir)?;
                    dirs.push(dir);
                }
                // Only this call's replicas (an earlier run may have left others).
                let set = analysis::replicas::read_runs(&dirs)?;
                outln!(
                    out,
                    "scenario `{}`: {} seeds ({first}..{}), backend {:?}",
                    scn.name,
                    seeds,
                    first + u64::from(seeds) - 1,
                    backend
                );
                outln!(out, "{}", analysis::replicas::replicas_table(&set));
                outln!(
                    out,
                    "results in {} (one folder per seed)",
                    out_dir.display()
                );
                return Ok(());
            }
            let opts = RunOptions {
                out_dir: Some(out_dir.clone()),
                driver,
                only: variants,
                progress: !quiet,
                parallel: true,
                backend,
                requests,
            };
            if !scn.sweep.is_empty() {
                return run_sweep_command(&scn, &opts, shard, &scenario, &out_dir, out);
            }
            if shard.is_some() {
                anyhow::bail!("--shard: {} has no [sweep] to split", scenario.display());
            }
            let results = run_scenario(&scn, &opts).map_err(|e| match e {
                // Scenario errors already name the file.
                sim::SimError::Scenario(_) => anyhow::Error::from(e),
                other => anyhow::anyhow!("{}: {other}", scenario.display()),
            })?;
            let summaries: Vec<_> = results.iter().map(|r| r.summary.clone()).collect();
            outln!(
                out,
                "scenario `{}`: {} variants, seed {}, backend {:?}",
                scn.name,
                summaries.len(),
                scn.seed,
                backend
            );
            outln!(out, "{}", analysis::comparison_table(&summaries));
            for r in &results {
                for w in &r.warnings {
                    outln!(out, "warning: {w}");
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
        Command::Validate { scenario } => {
            let scn = Scenario::load(&scenario, None)?;
            // Open the workload too: trace and length files must exist and have their columns.
            sim::workload::Workload::open(&scn.base.workload, &scn.base_dir, scn.seed)?;
            print_plan(out, &scn);
            outln!(out);
            // Every point of a sweep must resolve too.
            let points = scn.sweep_points();
            if !scn.sweep.is_empty() {
                for p in &points {
                    scn.at_point(p)?;
                }
            }
            if scn.sweep.is_empty() {
                outln!(out, "ok: {} variant(s) fit", scn.variants.len());
            } else {
                outln!(
                    out,
                    "ok: {} variant(s) fit at each of the {} sweep points",
                    scn.variants.len(),
                    points.len()
                );
            }
            Ok(())
        }
        Command::Plan {
            scenario,
            rate,
            gpus,
            tps,
            dtypes,
            requests,
            prices,
        } => {
            if requests == 0 {
                anyhow::bail!("--requests: must be at least 1");
            }
            if !(rate > 0.0 && rate.is_finite()) {
                anyhow::bail!(
                    "--rate: must be a positive number of requests per second, got {rate}"
                );
            }
            let scn = Scenario::load(&scenario, None)?;
            let base = &scn.base;
            let dtypes = dtypes
                .iter()
                .map(|d| {
                    toml::Value::String(d.clone())
                        .try_into::<sim::catalog::Dtype>()
                        .map_err(|_| anyhow::anyhow!("--dtype: unknown weight format `{d}`"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let prices = prices
                .iter()
                .map(|p| {
                    let (g, v) = p
                        .split_once('=')
                        .ok_or_else(|| anyhow::anyhow!("--price: expected GPU=USD, got `{p}`"))?;
                    let v: f64 = v
                        .parse()
                        .map_err(|_| anyhow::anyhow!("--price: `{v}` is not a number"))?;
                    if !(v >= 0.0 && v.is_finite()) {
                        anyhow::bail!("--price: {g}: must be a non-negative number of USD per GPU-hour, got {v}");
                    }
                    if sim::catalog::find_gpu(g).is_none() {
                        anyhow::bail!("--price: unknown GPU `{g}` (see `sim gpus`)");
                    }
                    Ok((g.to_string(), v))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let inputs = sim::plan::PlanInputs {
                target_rate: rate,
                gpus: if gpus.is_empty() {
                    base.hardware.gpu.iter().cloned().collect()
                } else {
                    gpus
                },
                tps: if tps.is_empty() {
                    vec![base.hardware.tp]
                } else {
                    tps
                },
                dtypes: if dtypes.is_empty() {
                    vec![base.model.dtype]
                } else {
                    dtypes
                },
                requests,
                prices,
            };
            if inputs.gpus.is_empty() {
                anyhow::bail!(
                    "--gpu: the scenario describes its GPU in a file; name catalog GPUs to compare"
                );
            }
            let rows = sim::plan::plan(&scn, &inputs)?;
            outln!(out, "{}", sim::plan::table(&rows, rate).trim_end());
            Ok(())
        }
        Command::Calibrate {
            out: path,
            backend,
            model,
            steps,
            gpu,
            ..
        } if backend.is_some_and(|b| b != BackendKind::Model) || steps.is_some() => {
            let b = backend.unwrap_or(BackendKind::Cuda);
            let m = sim::catalog::find_model(&model).ok_or_else(|| {
                anyhow::anyhow!("--model: unknown model `{model}` (sim models lists them)")
            })?;
            if m.is_moe() {
                anyhow::bail!(
                    "--model {model}: the CUDA runtime runs dense models; calibrate with a dense one"
                );
            }
            let gpu_of = |name: &str| {
                sim::catalog::find_gpu(name).ok_or_else(|| {
                    anyhow::anyhow!("--gpu: unknown GPU `{name}` (sim gpus lists them)")
                })
            };
            let (points, gpu_spec, device, source) = match (b, steps) {
                (_, Some(file)) => {
                    let g = gpu.as_deref().ok_or_else(|| {
                        anyhow::anyhow!("--steps: give --gpu, the catalog GPU the steps ran on")
                    })?;
                    let spec = gpu_of(g)?;
                    (
                        sim::fidelity::read_steps(&file).map_err(|e| anyhow::anyhow!(e))?,
                        spec,
                        g.to_string(),
                        format!("--steps {}", file.display()),
                    )
                }
                (BackendKind::Cuda, None) => {
                    let info = kernels::cuda::probe().map_err(|e| {
                        anyhow::anyhow!(
                            "sim calibrate --backend cuda measures on an NVIDIA GPU and found none ({e}). On a GPU machine run: sim calibrate --backend cuda --model {model}; here, refit recorded steps with --steps FILE --gpu GPU"
                        )
                    })?;
                    let g = match &gpu {
                        Some(g) => g.clone(),
                        None => sim::catalog::gpu_for_device(&info.name)
                            .ok_or_else(|| {
                                anyhow::anyhow!(
                                    "the device `{}` is not in the GPU catalog: give --gpu (sim gpus lists them)",
                                    info.name
                                )
                            })?
                            .to_string(),
                    };
                    let spec = gpu_of(&g)?;
                    // Weights, plus the KV of the largest grid step (128 x 2048 tokens).
                    let need = m.params() * 2.0
                        + 128.0 * 2048.0 * 4.0 * f64::from(m.layers * m.kv_heads * m.head_dim);
                    if (info.free_mem as f64) < need {
                        anyhow::bail!(
                            "{}: {:.1} GB free, the step grid of {model} needs about {:.1} GB",
                            info.name,
                            info.free_mem as f64 / 1e9,
                            need / 1e9
                        );
                    }
                    let decodes: Vec<(u32, u32)> = [1u32, 2, 4, 8, 16, 32, 64, 128]
                        .iter()
                        .flat_map(|&b| [(b, 512u32), (b, 2048)])
                        .collect();
                    let prefills = [128u32, 512, 1024, 2048, 4096];
                    let pts = kernels::cuda::check::measure_step_grid(
                        &m.llama_shape(),
                        16,
                        &decodes,
                        &prefills,
                    )?;
                    let target = path
                        .clone()
                        .unwrap_or_else(|| PathBuf::from(format!("calibration/{g}-cuda.toml")));
                    let csv = target.with_extension("steps.csv");
                    std::fs::write(&csv, sim::fidelity::steps_csv(&pts))
                        .map_err(|e| anyhow::anyhow!("{}: {e}", csv.display()))?;
                    (pts, spec, info.name, "--backend cuda".to_string())
                }
                (other, None) => anyhow::bail!(
                    "--backend {other:?}: sim calibrate measures the CUDA runtime (--backend cuda), or refits recorded steps (--steps FILE)"
                ),
            };
            let path = path.unwrap_or_else(|| {
                PathBuf::from(format!("calibration/{}-cuda.toml", gpu_spec.name))
            });
            let d = sim::cost_model::Deployment {
                model: m.clone(),
                gpu: gpu_spec.clone(),
                tp: 1,
                pp: 1,
                dtype: sim::catalog::Dtype::Bf16,
                kv_dtype: sim::catalog::Dtype::Bf16,
            };
            let fit = sim::fidelity::fit_steps(&d, 16, &points)
                .ok_or_else(|| anyhow::anyhow!("{source}: no step measurements"))?;
            let text =
                sim::fidelity::fit_toml(&fit, &source, &device, &sim::fidelity::today(), &model);
            std::fs::write(&path, &text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            outln!(out, "{}", text.trim_end());
            outln!(out, "wrote {}", path.display());
            Ok(())
        }
        Command::Fidelity {
            scenario,
            calibration,
            backend,
            requests,
            out: out_dir,
        } => {
            if backend == BackendKind::Model {
                anyhow::bail!("--backend model: fidelity compares the cost model with a real backend (cuda or cpu)");
            }
            if backend == BackendKind::Cuda {
                kernels::cuda::probe().map_err(|e| {
                    anyhow::anyhow!(
                        "sim fidelity --backend cuda runs the scenario on an NVIDIA GPU and found none ({e}). On a GPU machine run: sim calibrate --backend cuda --model <the scenario's model> --out calib.toml, then sim fidelity {} --calibration calib.toml",
                        scenario.display()
                    )
                })?;
            }
            let measured_scn = Scenario::load(&scenario, None)?;
            let simulated_scn = Scenario::load_calibrated(&scenario, None, &calibration)?;
            let out_dir = out_dir.unwrap_or_else(|| {
                PathBuf::from("results").join(format!("{}-fidelity", measured_scn.name))
            });
            let run_one = |scn: &Scenario, b: BackendKind, dir: PathBuf| {
                run_scenario(
                    scn,
                    &RunOptions {
                        out_dir: Some(dir),
                        driver: sim::driver::DriverKind::Inline,
                        only: Vec::new(),
                        progress: false,
                        parallel: b == BackendKind::Model,
                        backend: b,
                        requests,
                    },
                )
            };
            let real = run_one(&measured_scn, backend, out_dir.join("measured"))?;
            let sim_runs = run_one(
                &simulated_scn,
                BackendKind::Model,
                out_dir.join("simulated"),
            )?;
            let mut rows = Vec::new();
            for r in &real {
                let v = &r.summary.variant;
                let Some(s) = sim_runs.iter().find(|x| &x.summary.variant == v) else {
                    continue;
                };
                let steps = |side: &str| {
                    sim::fidelity::step_percentiles(&out_dir.join(side).join(v))
                        .map_err(|e| anyhow::anyhow!(e))
                };
                rows.extend(sim::fidelity::fidelity_rows(
                    v,
                    &s.summary,
                    &r.summary,
                    steps("simulated")?,
                    steps("measured")?,
                ));
            }
            let (table, csv) = sim::fidelity::fidelity_outputs(&rows);
            let path = out_dir.join("fidelity.csv");
            std::fs::write(&path, csv).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            outln!(
                out,
                "fidelity of `{}`: cost model (calibration {}) against --backend {:?}",
                measured_scn.name,
                calibration.display(),
                backend
            );
            outln!(out, "{table}");
            outln!(out, "wrote {}", path.display());
            Ok(())
        }
        Command::Calibrate {
            from, out: path, ..
        } => {
            let path = path.unwrap_or_else(|| PathBuf::from("calibration/fitted.toml"));
            let fit = if from.is_file() {
                sim::validation::calibrate_points(&from)?
            } else {
                sim::validation::calibrate(&from)?
            };
            let text = sim::validation::fit_toml(&fit, &from.display().to_string());
            std::fs::write(&path, &text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            outln!(out, "{}", text.trim_end());
            outln!(out, "wrote {}", path.display());
            Ok(())
        }
        Command::ValidateModel { data, out: path } => {
            let calibration = sim::validation::calibration_checks(&data.join("calibration.csv"))?;
            let profiles = sim::validation::profile_checks(&data)?;
            let throughput = sim::validation::throughput_checks(&data.join("calibration.csv"))?;
            let splitwise = sim::validation::splitwise_measurements(&data.join("calibration.csv"))?;
            let held_out = sim::validation::vllm_2023_held_out(&splitwise);
            let text = sim::validation::report(&calibration, &profiles, &throughput, &held_out);
            std::fs::write(&path, &text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            if let Some(summary) = text.split("## Summary").nth(1) {
                outln!(out, "{}", summary.trim());
            }
            outln!(out, "wrote {}", path.display());
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
        Command::Generate {
            model,
            prompt,
            chat,
            system,
            max_tokens,
            temperature,
            top_k,
            top_p,
            seed,
            backend,
            ids,
        } => {
            if backend == BackendKind::Model {
                anyhow::bail!(
                    "--backend model: the cost model has no logits to generate from; use --backend cpu or cuda"
                );
            }
            if !temperature.is_finite() || temperature < 0.0 {
                anyhow::bail!("--temperature: must be 0 (greedy) or positive, got {temperature}");
            }
            if !(top_p > 0.0 && top_p <= 1.0) {
                anyhow::bail!("--top-p: must be in (0, 1], got {top_p}");
            }
            let gguf = kernels::gguf::Gguf::open(&model)?;
            let tok = kernels::tokenizer::Tokenizer::from_gguf(&gguf)?;
            let text = if chat {
                let mut messages = Vec::new();
                if let Some(s) = system {
                    messages.push(kernels::tokenizer::Message {
                        role: "system".into(),
                        content: s,
                    });
                }
                messages.push(kernels::tokenizer::Message {
                    role: "user".into(),
                    content: prompt,
                });
                tok.apply_chat_template(&messages, true)?
            } else {
                prompt
            };
            let mut prompt_ids = Vec::new();
            if tok.add_bos {
                prompt_ids.extend(tok.bos);
            }
            prompt_ids.extend(tok.encode(&text, true));
            let block_size = 16u32;
            let need = prompt_ids.len() as u64 + u64::from(max_tokens);
            let context = gguf
                .meta_u32("llama.context_length")
                .map_or(u64::from(u32::MAX), u64::from);
            if need > context {
                anyhow::bail!(
                    "{} prompt tokens + --max-tokens {max_tokens} = {need} exceed the model's context of {context} tokens",
                    prompt_ids.len()
                );
            }
            let blocks = (need.div_ceil(u64::from(block_size)) + 1) as u32;
            let sampling = engine::request::SamplingParams {
                temperature,
                top_k,
                top_p,
                seed,
            };
            // Stream the text: decode everything drawn so far and print what is new, holding
            // back a trailing partial UTF-8 character.
            let mut stdout = std::io::stdout().lock();
            let mut drawn = Vec::new();
            let mut printed = 0usize;
            let on_token = |t| {
                drawn.push(t);
                let s = tok.decode(&drawn, false);
                if s.len() > printed && !s.ends_with('\u{FFFD}') {
                    let _ = std::io::Write::write_all(
                        &mut stdout,
                        s.as_bytes().get(printed..).unwrap_or_default(),
                    );
                    let _ = std::io::Write::flush(&mut stdout);
                    printed = s.len();
                }
            };
            use kernels::generate::StepRuntime as _;
            let gen = if backend == BackendKind::Cpu {
                let mut rt = kernels::cpu::CpuRuntime::from_gguf(&gguf, block_size, blocks)?;
                rt.generate(&prompt_ids, max_tokens, sampling, tok.eos, on_token)
                    .map_err(anyhow::Error::msg)?
            } else {
                let mut rt = kernels::cuda::CudaRuntime::from_gguf(&gguf, block_size, blocks)?;
                rt.warm_up()?;
                rt.generate(&prompt_ids, max_tokens, sampling, tok.eos, on_token)
                    .map_err(anyhow::Error::msg)?
            };
            let s = tok.decode(&gen.tokens, false);
            if s.len() > printed {
                let _ = std::io::Write::write_all(
                    &mut stdout,
                    s.as_bytes().get(printed..).unwrap_or_default(),
                );
            }
            let _ = std::io::Write::write_all(&mut stdout, b"\n");
            let stop = if gen.tokens.last().copied() == tok.eos && tok.eos.is_some() {
                "end of sequence"
            } else {
                "max tokens"
            };
            if ids {
                outln!(out, "prompt ids: {prompt_ids:?}");
                outln!(out, "completion ids: {:?}", gen.tokens);
            }
            let ms = |ns: u64| ns as f64 / 1e6;
            outln!(
                out,
                "prompt {} tokens, prefill {:.1} ms ({:.0} tok/s); generated {} tokens, decode {:.1} ms ({:.1} tok/s); stopped at {stop}",
                prompt_ids.len(),
                ms(gen.prefill_ns),
                prompt_ids.len() as f64 / (gen.prefill_ns.max(1) as f64 / 1e9),
                gen.tokens.len(),
                ms(gen.decode_ns),
                f64::from(gen.decode_steps) / (gen.decode_ns.max(1) as f64 / 1e9)
            );
            Ok(())
        }
        Command::Doctor => {
            let info = kernels::cuda::probe()?;
            outln!(out, "GPU                {}", info.name);
            outln!(
                out,
                "compute capability {}.{} (NVRTC target {})",
                info.compute_capability.0,
                info.compute_capability.1,
                kernels::cuda::arch_for(info.compute_capability)
            );
            outln!(
                out,
                "driver API         {}.{}",
                info.driver_version / 1000,
                info.driver_version % 1000 / 10
            );
            outln!(out, "multiprocessors    {}", info.sm_count);
            outln!(
                out,
                "memory             {:.1} GiB total, {:.1} GiB free",
                info.total_mem as f64 / 1073741824.0,
                info.free_mem as f64 / 1073741824.0
            );
            outln!(
                out,
                "libraries          driver, NVRTC and cuBLAS loaded; kernels compiled"
            );
            Ok(())
        }
        Command::CudaCheck { seed } => {
            let cases = kernels::cuda::check::attention_check(seed)?;
            let mut failed = 0;
            outln!(
                out,
                "{:<44} {:>6} {:>10} {:>6}  verdict",
                "case",
                "splits",
                "rel err",
                "bad"
            );
            for c in &cases {
                // bf16 inputs and output: the output's rounding alone is ~2e-3 relative.
                let ok = c.bad == 0 && c.rel_err < 1e-2;
                failed += usize::from(!ok);
                outln!(
                    out,
                    "{:<44} {:>6} {:>10.2e} {:>6}  {}",
                    c.name,
                    c.splits,
                    c.rel_err,
                    c.bad,
                    if ok { "ok" } else { "FAIL" }
                );
            }
            let mut runtime = kernels::cuda::check::transfer_check(seed)?;
            runtime.extend(kernels::cuda::check::graph_check(seed)?);
            runtime.extend(kernels::cuda::check::verify_check(seed)?);
            runtime.extend(kernels::cuda::check::sampling_check(seed)?);
            outln!(
                out,
                "{:<78} {:>10} {:>10}  verdict",
                "runtime case",
                "rel err",
                "bad/total"
            );
            for c in &runtime {
                // Exact checks have rel_err 0; skinny_gemm vs cuBLAS differ by bf16 rounding
                // of the activations between layers.
                let ok = c.bad == 0 && c.rel_err < 1e-2;
                failed += usize::from(!ok);
                outln!(
                    out,
                    "{:<78} {:>10.2e} {:>10}  {}",
                    c.name,
                    c.rel_err,
                    format!("{}/{}", c.bad, c.total),
                    if ok { "ok" } else { "FAIL" }
                );
            }
            let all = cases.len() + runtime.len();
            outln!(out, "{} passed, {} failed", all - failed, failed);
            if failed > 0 {
                anyhow::bail!("{failed} CUDA check cases failed");
            }
            Ok(())
        }
        Command::CudaOracle { model, oracle } => {
            let gguf = kernels::gguf::Gguf::open(&model)?;
            let cases = kernels::cuda::check::oracle_check(&gguf, &oracle)?;
            outln!(
                out,
                "{:<42} {:>9} {:>10} {:>13}",
                "prompt",
                "matched",
                "margin@div",
                "max |dlogit|"
            );
            let (mut full, mut total) = (0, 0);
            for c in &cases {
                total += 1;
                full += usize::from(c.matched == c.generated);
                outln!(
                    out,
                    "{:<42} {:>4}/{:<4} {:>10} {:>13.3}",
                    c.prompt,
                    c.matched,
                    c.generated,
                    c.margin_at_divergence
                        .map_or("-".to_string(), |m| format!("{m:.3}")),
                    c.max_logit_err
                );
            }
            outln!(
                out,
                "{full} of {total} prompts reproduce llama.cpp's greedy tokens in full"
            );
            let pairs = kernels::cuda::check::cpu_cuda_agreement(&gguf, &oracle)?;
            outln!(
                out,
                "\nCUDA (bf16) against the CPU runtime (f32), teacher-forced on llama.cpp's tokens:"
            );
            outln!(
                out,
                "{:<42} {:>12} {:>12} {:>14}",
                "prompt",
                "same argmax",
                "gap at diff",
                "max |dlogit|"
            );
            let (mut same, mut positions) = (0, 0);
            for p in &pairs {
                same += p.same_argmax;
                positions += p.positions;
                outln!(
                    out,
                    "{:<42} {:>6}/{:<5} {:>12.3} {:>14.3}",
                    p.prompt,
                    p.same_argmax,
                    p.positions,
                    p.gap_at_difference,
                    p.max_logit_diff
                );
            }
            outln!(
                out,
                "{same} of {positions} positions: the same argmax on both runtimes"
            );
            Ok(())
        }
        Command::CpuBench {
            model,
            prompt,
            reps,
        } => {
            if prompt == 0 {
                anyhow::bail!("--prompt: must be at least 1");
            }
            let gguf = kernels::gguf::Gguf::open(&model)?;
            let blocks = (prompt + 1).div_ceil(16) * 32;
            let mut rt = kernels::cpu::CpuRuntime::from_gguf(&gguf, 16, blocks)?;
            let lines = rt.bench(prompt, reps)?;
            outln!(
                out,
                "{} threads; median of {reps} steps",
                rayon::current_num_threads()
            );
            outln!(out, "{:<44} {:>10} {:>12}", "measurement", "ms", "tokens/s");
            for l in &lines {
                outln!(
                    out,
                    "{:<44} {:>10.1} {:>12.1}",
                    l.name,
                    l.ms,
                    f64::from(l.tokens) / (l.ms / 1e3)
                );
            }
            Ok(())
        }
        Command::CudaBench { model, block_size } => {
            let spec = sim::catalog::find_model(&model).ok_or_else(|| {
                anyhow::anyhow!("--model: unknown model `{model}` (see `sim models`)")
            })?;
            let shape = spec.llama_shape();
            let ceil = kernels::cuda::check::ceilings()?;
            outln!(
                out,
                "measured: HBM {:.0} GB/s (device copy, read + write), bf16 GEMM {:.0} TFLOP/s (8192^3)",
                ceil.hbm_bw / 1e9,
                ceil.gemm_flops / 1e12
            );
            let mut lines = Vec::new();
            for (batch, ctx) in [
                (32u32, 4096u32),
                (32, 16384),
                (32, 32768),
                (128, 4096),
                (128, 8192),
            ] {
                lines.push(kernels::cuda::check::bench_decode_attention(
                    &shape,
                    batch,
                    ctx,
                    block_size,
                    ceil.hbm_bw,
                )?);
            }
            lines.push(kernels::cuda::check::bench_prefill_attention(
                &shape,
                2048,
                block_size,
                ceil.gemm_flops,
            )?);
            lines.extend(kernels::cuda::check::bench_steps(&shape, ceil, block_size)?);
            for draws in [1usize, 64, 256] {
                lines.push(kernels::cuda::check::bench_sampling(
                    draws,
                    shape.vocab,
                    ceil.hbm_bw,
                )?);
            }
            outln!(
                out,
                "{:<58} {:>10} {:>10} {:>8}  floor",
                "measurement",
                "ms",
                "floor ms",
                "ratio"
            );
            for l in &lines {
                outln!(
                    out,
                    "{:<58} {:>10.3} {:>10.3} {:>7.2}x  {}",
                    l.name,
                    l.ms,
                    l.floor_ms,
                    l.ms / l.floor_ms,
                    l.floor
                );
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
