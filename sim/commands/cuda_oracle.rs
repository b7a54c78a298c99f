//! `sim cuda-oracle`: run a llama.cpp oracle file's prompts through the CUDA runtime with a
//! real GGUF model and compare the greedy tokens and top logits.

use std::path::PathBuf;

/// Run a llama.cpp oracle file's prompts through the CUDA runtime with a real GGUF
/// model and compare the greedy tokens and top logits.
#[derive(clap::Args)]
pub struct Args {
    /// The GGUF model (SmolLM2-135M-Instruct Q4_1 for the shipped oracle).
    #[arg(long)]
    pub model: PathBuf,
    /// The oracle JSON.
    #[arg(long, default_value = "tests/data/oracle/smollm2_q4_1_llamacpp.json")]
    pub oracle: PathBuf,
}

/// Runs `sim cuda-oracle`, printing into `out`.
pub fn run(args: Args, out: &mut String) -> anyhow::Result<()> {
    let Args { model, oracle } = args;
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
