//! `sim cpu-bench`: time the CPU runtime on a GGUF model: a prefill, and decode steps of 1, 8,
//! 16 and 32 sequences (aggregate tokens/s).

use std::path::PathBuf;

/// Time the CPU runtime on a GGUF model: a prefill, and decode steps of 1, 8, 16 and
/// 32 sequences (aggregate tokens/s).
#[derive(clap::Args)]
pub struct Args {
    /// The GGUF model file.
    #[arg(long)]
    pub model: PathBuf,
    /// Prompt length, and the decodes' context.
    #[arg(long, default_value_t = 128)]
    pub prompt: u32,
    /// Timed steps per line (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
}

/// Runs `sim cpu-bench`, printing into `out`.
pub fn run(args: Args, out: &mut String) -> anyhow::Result<()> {
    let Args {
        model,
        prompt,
        reps,
    } = args;
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
