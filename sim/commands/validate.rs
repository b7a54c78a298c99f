//! `sim validate`: a scenario parsed and checked without running it (its workload opened,
//! every sweep point resolved), and each variant's memory plan printed: weights,
//! activations, KV bytes per token, the pool in blocks and tokens, concurrency at max length.

use std::path::PathBuf;

use engine::block_manager::SideGroup;
use sim::scenario::Scenario;

use super::gb;

/// Parse a scenario and print each variant's memory plan without running it.
#[derive(clap::Args)]
pub struct Args {
    /// Scenario TOML file.
    pub scenario: PathBuf,
}

/// Runs `sim validate`, printing into `out`.
pub fn run(args: Args, out: &mut String) -> anyhow::Result<()> {
    let Args { scenario } = args;
    let scn = Scenario::load(&scenario, None)?;
    // Open the workload too: trace and length files must exist and have their columns;
    // a trace's every row is read, as `sim run` would read it.
    let workload = sim::workload::Workload::open(&scn.base.workload, &scn.base_dir, scn.seed)
        .map_err(|e| anyhow::anyhow!("{}: {e}", scenario.display()))?;
    let trace_rows = if scn.base.workload.trace.is_some() {
        let mut n = 0u64;
        for r in workload {
            r.map_err(|e| anyhow::anyhow!("{}: {e}", scenario.display()))?;
            n += 1;
        }
        Some(n)
    } else {
        None
    };
    print_plan(out, &scn);
    outln!(out);
    // Every point of a sweep must resolve too.
    let points = scn.sweep_points();
    if !scn.sweep.is_empty() {
        for p in &points {
            scn.at_point(p)?;
        }
    }
    if let Some(n) = trace_rows {
        outln!(out, "trace: {n} requests read, every row valid");
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

/// Each variant's deployment, memory plan and scheduler limits.
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
            let shared = if d.model.arch.shared_expert_intermediate > 0 {
                " and the shared expert"
            } else {
                ""
            };
            format!(
                ", {:.2} B active: {} of {} experts{shared}",
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
            "  hardware         {} x {} ({:.1} GB each), tp = {}, pp = {}{}",
            d.num_gpus(),
            d.gpu.name,
            d.gpu.mem_bytes / 1e9,
            d.tp,
            d.pp,
            if d.parallel.is_none() {
                String::new()
            } else {
                format!(
                    ", attention dp = {}, ep = {} (each expert split {} ways)",
                    d.parallel.dp,
                    d.parallel.ep,
                    d.moe_tp()
                )
            }
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
        if d.model.arch.is_plain() {
            outln!(
                out,
                "  KV per token     {} bytes / GPU ({} layers x {} KV heads x {} head dim x 2 x {} B)",
                m.kv_bytes_per_token,
                d.model.layers,
                d.kv_heads_per_gpu(),
                d.model.head_dim,
                d.kv_dtype.bytes()
            );
        } else {
            outln!(
                out,
                "  KV per token     {} bytes / GPU (the layers whose cache grows with every token)",
                m.kv_bytes_per_token
            );
            // Each kind of layer's cache, as vLLM's hybrid allocator groups them.
            for g in d.kv_groups(m.block_size) {
                let size = if g.bytes_per_token > 0.0 {
                    format!("{} bytes / token", g.bytes_per_token)
                } else {
                    format!(
                        "{:.2} MB / sequence, whatever its length",
                        g.bytes_per_seq / 1e6
                    )
                };
                let detail = match &d.model.arch.mla {
                    Some(mla) if g.bytes_per_token > 0.0 => format!(
                        " ({} layers x ({} latent + {} RoPE key) x {} B, whole on each GPU)",
                        g.layers,
                        mla.kv_lora_rank,
                        mla.qk_rope_head_dim,
                        d.kv_dtype.bytes()
                    ),
                    _ => format!(" ({} layers)", g.layers),
                };
                outln!(out, "    {:<31}{size}{detail}", g.kind);
            }
            if !m.side_groups.is_empty() {
                // vLLM's hybrid allocator: one pool of pages, a block table per group.
                let pages = |sliding: bool| -> Vec<u32> {
                    m.side_groups
                        .iter()
                        .filter(|g| matches!(g, SideGroup::Sliding { .. }) == sliding)
                        .map(|g| g.decode_pages(m.block_size))
                        .collect()
                };
                let mut groups = Vec::new();
                for (sliding, what) in [
                    (true, "sliding group(s) of {} pages while decoding"),
                    (false, "linear-state group(s) of {} page(s)"),
                ] {
                    let p = pages(sliding);
                    if let Some(first) = p.first() {
                        groups.push(format!(
                            "{} {}",
                            p.len(),
                            what.replace("{}", &first.to_string())
                        ));
                    }
                }
                outln!(
                    out,
                    "  hybrid pages     blocks are {}-byte pages shared by the layer groups: a sequence holds its full-attention blocks and {}; at most {} pages beside its own blocks",
                    m.block_bytes,
                    groups.join(" and "),
                    m.side_pages_per_seq
                );
            }
        }
        outln!(
            out,
            "  KV pool          {} blocks x {} tokens = {} tokens ({} bytes per block)",
            m.num_blocks,
            m.block_size,
            m.pool_tokens,
            m.block_bytes
        );
        let ranks = d.parallel.dp;
        outln!(
            out,
            "  max concurrency  {:.2} sequences of max_model_len {}{}",
            m.max_concurrency_at_max_len,
            m.max_model_len,
            if ranks > 1 {
                format!(
                    " per attention-DP rank ({:.2} in all over {ranks} ranks)",
                    m.max_concurrency_at_max_len * f64::from(ranks)
                )
            } else {
                String::new()
            }
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
