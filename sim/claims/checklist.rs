//! Claim 9: four items of the articles' production checklist, each a pair of variants.
//!
//! In: `checklist.toml`, variants `gmu-0.90` (the base) and `gmu-0.95`
//! (`gpu_memory_utilization`), `prefix-caching` (against the base), `no-admission-limit`
//! and `admission-limit` (KV reserved at admission), `prefill-first` (against the base's
//! chunked prefill), swept over the load: a rate the GPU sustains (the lowest point) and one
//! beyond it (the highest), where KV runs out. Out: one row per item with the figures that
//! move.

use super::{at, figs, swept, ClaimRow, Ctx, Verdict};
use crate::SimError;

fn change(a: f64, b: f64) -> String {
    format!("{:+.0}%", 100.0 * (b / a.max(1e-12) - 1.0))
}

pub(super) fn evaluate(ctx: &Ctx<'_>) -> Result<Vec<ClaimRow>, SimError> {
    let names = [
        "gmu-0.90",
        "gmu-0.95",
        "prefix-caching",
        "no-admission-limit",
        "admission-limit",
        "prefill-first",
    ];
    for n in names {
        ctx.variant(n)?;
    }
    let sweep = ctx.sweep()?;
    let (lo_point, hi_point) = ctx.ends(&sweep)?;
    let rate = |p: usize| swept(&sweep, p, "rate").unwrap_or_default();
    let (lo_rate, hi_rate) = (rate(lo_point), rate(hi_point));
    // Within capacity (the lowest rate) and beyond it (the highest).
    let get = |n: &str| at(&sweep, lo_point, n);
    let over = |n: &str| at(&sweep, hi_point, n);
    let (base, hi) = (get("gmu-0.90")?, get("gmu-0.95")?);
    let (obase, ohi) = (over("gmu-0.90")?, over("gmu-0.95")?);
    let (b90, b95) = (
        ctx.variant("gmu-0.90")?.memory.num_blocks,
        ctx.variant("gmu-0.95")?.memory.num_blocks,
    );
    let gpu = &ctx.variant("gmu-0.90")?.deployment.gpu;
    let mut rows = vec![ClaimRow {
        scenario: String::new(),
        figures: figs(&[("kv_blocks_gain", f64::from(b95) / f64::from(b90)), ("throughput_gain_low", hi.output_throughput / base.output_throughput), ("throughput_gain_high", ohi.output_throughput / obase.output_throughput)]),
        claim: "gpu_memory_utilization 0.90, not 0.95".into(),
        article: "0.90: the CUDA runtime needs headroom; OOM kills the server".into(),
        simulated: format!(
            "0.95 gives {} KV blocks ({b95} vs {b90}); at {lo_rate} req/s throughput {}, mean TTFT {}; at {hi_rate} req/s throughput {}, mean TTFT {}, preemptions {} vs {}",
            change(f64::from(b90), f64::from(b95)),
            change(base.output_throughput, hi.output_throughput),
            change(base.mean_ttft_ms, hi.mean_ttft_ms),
            change(obase.output_throughput, ohi.output_throughput),
            change(obase.mean_ttft_ms, ohi.mean_ttft_ms),
            ohi.num_preemptions,
            obase.num_preemptions
        ),
        verdict: if ohi.output_throughput <= obase.output_throughput * 1.05 {
            Verdict::HoldsOnlyWhen(format!(
                "its cost is small: 0.95's extra {:.1} GB of KV buys {} throughput even beyond capacity (the simulator models no out-of-memory, the risk 0.90 avoids)",
                0.05 * gpu.mem_bytes / 1e9,
                change(obase.output_throughput, ohi.output_throughput)
            ))
        } else {
            Verdict::DoesNotHold
        },
        why: "the last 5% of memory goes entirely to the KV pool; it pays only when requests queue or are preempted for KV".into(),
    }];
    let pc = get("prefix-caching")?;
    rows.push(ClaimRow {
        scenario: String::new(),
        figures: figs(&[("hit_rate", pc.prefix_cache_hit_rate), ("ttft_ratio", pc.mean_ttft_ms / base.mean_ttft_ms)]),
        claim: "prefix caching pays on shared system prompts".into(),
        article: "enable it for workloads with shared system prompts".into(),
        simulated: format!(
            "at {lo_rate} req/s: hit rate {:.0}% of prompt tokens; mean TTFT {} ({:.0} -> {:.0} ms), p99 TTFT {}, throughput {}",
            100.0 * pc.prefix_cache_hit_rate,
            change(base.mean_ttft_ms, pc.mean_ttft_ms),
            base.mean_ttft_ms,
            pc.mean_ttft_ms,
            change(base.p99_ttft_ms, pc.p99_ttft_ms),
            change(base.output_throughput, pc.output_throughput)
        ),
        verdict: Verdict::holds_if(pc.mean_ttft_ms < base.mean_ttft_ms && pc.prefix_cache_hit_rate > 0.3),
        why: "a hit skips the prefill of the cached blocks, so TTFT falls by the share of the prompt the system prompt is".into(),
    });
    let (no, lim) = (over("no-admission-limit")?, over("admission-limit")?);
    rows.push(ClaimRow {
        scenario: String::new(),
        figures: figs(&[("preemptions_without", no.num_preemptions as f64), ("preemptions_with", lim.num_preemptions as f64)]),
        claim: "admission limits keep KV from blowing up".into(),
        article: "reject or queue requests when concurrency would blow up KV".into(),
        simulated: format!(
            "at {hi_rate} req/s, admitting on the next step's blocks: {} preemptions, {} recomputed tokens, mean batch {:.0}, p99 TPOT {:.0} ms, {:.0} tok/s, mean queueing {:.0} ms; reserving prompt + max_tokens: {} preemptions, mean batch {:.0}, p99 TPOT {:.0} ms, {:.0} tok/s, mean queueing {:.0} ms",
            no.num_preemptions,
            no.recomputed_tokens,
            no.mean_batch_size,
            no.p99_tpot_ms,
            no.output_throughput,
            no.mean_queue_ms,
            lim.num_preemptions,
            lim.mean_batch_size,
            lim.p99_tpot_ms,
            lim.output_throughput,
            lim.mean_queue_ms
        ),
        verdict: if lim.num_preemptions == 0 && no.num_preemptions > 0 {
            Verdict::Holds
        } else if no.num_preemptions == 0 {
            Verdict::HoldsOnlyWhen("KV runs out under load (here it did not)".into())
        } else {
            Verdict::DoesNotHold
        },
        why: "admitting on the next step's blocks alone lets decodes outgrow the pool and evict each other, and every eviction recomputes its tokens; reserving the worst case makes requests wait before they start instead, never after".into(),
    });
    let pf = get("prefill-first")?;
    let ttft = pf.mean_ttft_ms / base.mean_ttft_ms.max(1e-9) - 1.0;
    let tpot = pf.p99_tpot_ms / base.p99_tpot_ms.max(1e-9) - 1.0;
    rows.push(ClaimRow {
        scenario: String::new(),
        figures: figs(&[("ttft_change", ttft), ("p99_tpot_change", tpot)]),
        claim: "track TTFT and TPOT separately".into(),
        article: "one tells you about prefill and queueing, the other about decode".into(),
        simulated: format!(
            "at {lo_rate} req/s prefill-first against chunked prefill: mean TTFT {}, p99 TPOT {}, mean TPOT {}",
            change(base.mean_ttft_ms, pf.mean_ttft_ms),
            change(base.p99_tpot_ms, pf.p99_tpot_ms),
            change(base.mean_tpot_ms, pf.mean_tpot_ms)
        ),
        verdict: if ttft * tpot < 0.0 {
            Verdict::Holds
        } else {
            Verdict::HoldsOnlyWhen("a change moves the two apart (here both moved the same way)".into())
        },
        why: "whole prefills run before decodes and stall them (longer gaps between tokens) while new requests start sooner: one scheduler choice moves the two metrics in opposite directions".into(),
    });
    Ok(rows)
}
