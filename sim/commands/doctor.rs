//! `sim doctor`: report the GPU, driver, compute capability, memory, and whether NVRTC and
//! cuBLAS load and the kernels compile.

/// Report the GPU, driver, compute capability, memory, and whether NVRTC and cuBLAS
/// load and the kernels compile.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `sim doctor`, printing into `out`.
pub fn run(_: Args, out: &mut String) -> anyhow::Result<()> {
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
