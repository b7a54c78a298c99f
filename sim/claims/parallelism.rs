//! Claim 6: tensor parallelism gives lower latency than pipeline parallelism for a 70B
//! model on 4 GPUs; pipelines communicate less but waste compute in bubbles.
//!
//! In: `parallelism.toml`, variants `tp4`, `pp4` (a micro-batch per stage in flight),
//! `pp4-serial` (one batch at a time) and optionally `tp2-pp2`, swept over a closed loop's
//! concurrency (its lowest and highest points are read). Out: rows for latency at the
//! lowest load, the bubbles (PP with and without micro-batches, at both loads) and
//! throughput at the highest, and the bytes each scheme moves between GPUs per token (from
//! the model's shape).

use super::{at, figs, point_label, times, ClaimRow, Ctx, Verdict};
use crate::SimError;

pub(super) fn evaluate(ctx: &Ctx<'_>) -> Result<Vec<ClaimRow>, SimError> {
    let tp = ctx.variant("tp4")?;
    let pp = ctx.variant("pp4")?;
    let runs = ctx.sweep()?;
    let (lo, hi) = ctx.ends(&runs)?;
    let load = |p: usize| point_label(&runs, p);
    let need = |p: usize, v: &str| at(&runs, p, v);
    let mut variants: Vec<&str> = vec!["tp4", "pp4"];
    if ctx.scn.variants.iter().any(|v| v.name == "tp2-pp2") {
        variants.push("tp2-pp2");
    }
    let mut lat = Vec::new();
    for v in &variants {
        let s = need(lo, v)?;
        lat.push(format!(
            "{v}: TTFT {:.0} ms, TPOT {:.1} ms",
            s.mean_ttft_ms, s.mean_tpot_ms
        ));
    }
    let (t, p) = (need(lo, "tp4")?, need(lo, "pp4")?);
    let mut rows = vec![ClaimRow {
        scenario: String::new(),
        figures: figs(&[("tp_tpot_ms", t.mean_tpot_ms), ("pp_tpot_ms", p.mean_tpot_ms), ("tp_ttft_ms", t.mean_ttft_ms), ("pp_ttft_ms", p.mean_ttft_ms)]),
        claim: format!(
            "TP gives lower latency than PP ({} on {} {})",
            tp.deployment.model.name,
            tp.deployment.num_gpus(),
            tp.deployment.gpu.name
        ),
        article: "TP: lower latency; PP: higher latency".into(),
        simulated: format!("{}: {}", load(lo), lat.join("; ")),
        verdict: Verdict::holds_if(t.mean_tpot_ms < p.mean_tpot_ms && t.mean_ttft_ms < p.mean_ttft_ms),
        why: format!(
            "TP splits every layer over the GPUs, so a step takes about a quarter of one GPU's time plus two all-reduces a layer; PP runs the stages one after another, so a token still crosses all {} layers' weights in sequence ({} TPOT of PP over TP)",
            tp.deployment.model.layers,
            times(p.mean_tpot_ms / t.mean_tpot_ms.max(1e-9))
        ),
    }];
    // The bubbles: PP with a micro-batch per stage in flight against one batch at a time,
    // at both loads, and throughput at the highest.
    ctx.variant("pp4-serial")?;
    let mut thr = Vec::new();
    for v in variants.iter().chain(&["pp4-serial"]) {
        let s = need(hi, v)?;
        thr.push(format!("{v}: {:.0} tok/s", s.output_throughput));
    }
    let (th, ph, sh) = (need(hi, "tp4")?, need(hi, "pp4")?, need(hi, "pp4-serial")?);
    let (pl, sl) = (need(lo, "pp4")?, need(lo, "pp4-serial")?);
    let stages = pp.deployment.pp;
    let filled = ph.output_throughput / sh.output_throughput.max(1e-9);
    let alone = pl.output_throughput / sl.output_throughput.max(1e-9);
    rows.push(ClaimRow {
        scenario: String::new(),
        figures: figs(&[
            ("tp_tps", th.output_throughput),
            ("pp_tps", ph.output_throughput),
            ("pp_serial_tps", sh.output_throughput),
            ("microbatch_gain_high", filled),
            ("microbatch_gain_low", alone),
        ]),
        claim: "pipeline bubbles waste compute".into(),
        article: "\"Pipeline bubbles waste compute\"".into(),
        simulated: format!(
            "{}: {}; micro-batches in flight give PP{stages} {} the throughput of one batch at a time; {}: {}",
            load(hi),
            thr.join("; "),
            times(filled),
            load(lo),
            times(alone)
        ),
        verdict: if filled > 1.1 && alone < 1.05 {
            Verdict::HoldsOnlyWhen(format!(
                "a stage has no micro-batch of its own: one batch at a time, or fewer requests than stages ({})",
                load(lo)
            ))
        } else {
            Verdict::holds_if(ph.output_throughput < th.output_throughput)
        },
        why: format!(
            "one batch at a time, each of the {stages} GPUs idles while the others compute; a micro-batch per stage in flight (vLLM's max_concurrent_batches = pp) fills them once enough requests run, but a lone request cannot be split; in decode every micro-batch streams its stage's weights again, so PP{stages} stays at {:.0}% of TP{}'s throughput",
            100.0 * ph.output_throughput / th.output_throughput.max(1e-9),
            tp.deployment.tp
        ),
    });
    // Bytes between GPUs per token.
    let m = &tp.deployment.model;
    let act = 2.0;
    let n = f64::from(tp.deployment.tp);
    let tp_bytes = f64::from(m.layers) * 2.0 * 2.0 * (n - 1.0) / n * f64::from(m.hidden) * act;
    let pp_bytes = f64::from(stages - 1) * f64::from(m.hidden) * act;
    rows.push(ClaimRow {
        scenario: String::new(),
        figures: figs(&[("tp_bytes", tp_bytes), ("pp_bytes", pp_bytes)]),
        claim: "PP communicates less than TP".into(),
        article: "TP: high communication (all-reduce); PP: less".into(),
        simulated: format!(
            "per token: each TP{} GPU sends {:.2} MB (two ring all-reduces a layer); PP{stages} sends {:.3} MB in all (one hand-off per stage boundary)",
            tp.deployment.tp,
            tp_bytes / 1e6,
            pp_bytes / 1e6
        ),
        verdict: Verdict::holds_if(pp_bytes < tp_bytes),
        why: "TP all-reduces the hidden state twice per layer; PP passes it once per stage boundary; over NVLink the all-reduces cost little next to the latency PP adds".into(),
    });
    Ok(rows)
}
