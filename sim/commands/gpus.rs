//! `sim gpus`: list the GPU catalog.

/// List the GPU catalog.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `sim gpus`, printing into `out`.
pub fn run(_: Args, out: &mut String) -> anyhow::Result<()> {
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
    for g in sim::catalog::gpus() {
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
