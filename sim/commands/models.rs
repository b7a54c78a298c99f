//! `sim models`: list the model catalog.

/// List the model catalog.
#[derive(clap::Args)]
pub struct Args {}

/// Runs `sim models`, printing into `out`.
pub fn run(_: Args, out: &mut String) -> anyhow::Result<()> {
    outln!(
        out,
        "{:<17} {:>8} {:>6} {:>6} {:>9} {:>8} {:>10} {:>12}  hf id",
        "name",
        "params",
        "layers",
        "hidden",
        "heads/kv",
        "context",
        "bf16 GB",
        "KV B/token"
    );
    for m in sim::catalog::models() {
        let kv = m.kv_values_per_token() * 2.0;
        outln!(
            out,
            "{:<17} {:>7.2}B {:>6} {:>6} {:>9} {:>8} {:>10.1} {:>12}  {}",
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
