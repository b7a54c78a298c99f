//! `sim cuda-bench`: measure the GPU's ceilings and the CUDA runtime against them (synthetic
//! weights).

/// Measure the GPU's ceilings and the CUDA runtime against them (synthetic weights).
#[derive(clap::Args)]
pub struct Args {
    /// Catalog model whose shape is timed.
    #[arg(long, default_value = "llama-3-8b")]
    pub model: String,
    /// KV block size.
    #[arg(long, default_value_t = 16)]
    pub block_size: u32,
}

/// Runs `sim cuda-bench`, printing into `out`.
pub fn run(args: Args, out: &mut String) -> anyhow::Result<()> {
    let Args { model, block_size } = args;
    let spec = sim::catalog::find_model(&model)
        .ok_or_else(|| anyhow::anyhow!("--model: unknown model `{model}` (see `sim models`)"))?;
    if spec.is_moe() || !spec.gated_mlp || !spec.arch.is_plain() {
        anyhow::bail!(
            "--model {model}: the CUDA runtime runs dense Llama-architecture models; benchmark a dense one"
        );
    }
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
