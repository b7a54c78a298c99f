//! Claim 1: quantization's memory (140 / 70 / 35 GB for a 70B model; int4 "from 2x
//! A100-80GB to a single one") and decode speed-ups (int8 ~1.5x, int4 ~2.5x).
//!
//! In: `quantization.toml`, variants `fp16`, `int8`, `int4` on the same GPUs, swept over
//! the closed loop's concurrency (the lowest and the highest point are read). Out: rows
//! for the weights, the fewest GPUs each format fits on (memory plans resolved at TP 1, 2,
//! 4, 8), and the decode speed-up (mean TPOT of fp16 over the format's) at both loads.

use super::{at, figs, gb, point_label, times, within, ClaimRow, Ctx, Verdict};
use crate::sweep::SweepRun;
use crate::SimError;

/// Mean TPOT of `variant` at sweep point `point`.
fn tpot(runs: &[SweepRun], point: usize, variant: &str) -> Option<f64> {
    at(runs, point, variant).ok().map(|s| s.mean_tpot_ms)
}

/// The fewest GPUs (tensor parallel 1, 2, 4, 8) the variant's format fits on.
fn fewest_gpus(ctx: &Ctx<'_>, variant: &str) -> Result<Option<u32>, SimError> {
    let v = ctx.variant(variant)?;
    for tp in [1, 2, 4, 8] {
        let mut c = v.config.clone();
        c.hardware.tp = tp;
        c.hardware.pp = 1;
        if ctx.scn.resolve_config(variant, c).is_ok() {
            return Ok(Some(tp));
        }
    }
    Ok(None)
}

pub(super) fn evaluate(ctx: &Ctx<'_>) -> Result<Vec<ClaimRow>, SimError> {
    let mut rows = Vec::new();
    // Weights per format, all GPUs together.
    let weights = |name: &str| -> Result<f64, SimError> {
        let v = ctx.variant(name)?;
        Ok(v.memory.weight_bytes * f64::from(v.deployment.num_gpus()))
    };
    let (w16, w8, w4) = (weights("fp16")?, weights("int8")?, weights("int4")?);
    let model = &ctx.variant("fp16")?.deployment.model.name;
    let ok = within(w16, 140e9, 140e9, 0.05)
        && within(w8, 70e9, 70e9, 0.05)
        && within(w4, 35e9, 35e9, 0.1);
    rows.push(ClaimRow {
        scenario: String::new(),
        figures: figs(&[("fp16_bytes", w16), ("int8_bytes", w8), ("int4_bytes", w4)]),
        claim: "a 70B model's weights shrink 2x in int8 and 4x in int4".into(),
        article: "140 GB fp16, 70 GB int8, 35 GB int4".into(),
        simulated: format!("{} / {} / {} ({model})", gb(w16), gb(w8), gb(w4)),
        verdict: Verdict::holds_if(ok),
        why: format!(
            "parameters x bytes per weight; int4 carries an fp16 scale and a zero point per 128 weights and keeps the embeddings in 16 bits, so it saves {} rather than 4x",
            times(w16 / w4)
        ),
    });

    // GPUs each format needs.
    let gpu = ctx.variant("fp16")?.deployment.gpu.name;
    let (g16, g4) = (fewest_gpus(ctx, "fp16")?, fewest_gpus(ctx, "int4")?);
    let show = |g: Option<u32>| g.map_or("more than 8".to_string(), |g| g.to_string());
    let kv_room = |name: &str, tp: Option<u32>| -> Result<String, SimError> {
        let Some(tp) = tp else {
            return Ok("-".into());
        };
        let mut c = ctx.variant(name)?.config.clone();
        c.hardware.tp = tp;
        let v = ctx
            .scn
            .resolve_config(name, c)
            .map_err(SimError::Scenario)?;
        Ok(format!(
            "{} of KV, {:.0} sequences of {} tokens",
            gb(v.memory.kv_budget_bytes * f64::from(v.deployment.num_gpus())),
            v.memory.max_concurrency_at_max_len.floor(),
            v.memory.max_model_len
        ))
    };
    rows.push(ClaimRow {
        scenario: String::new(),
        figures: figs(&[("fp16_gpus", f64::from(g16.unwrap_or(0))), ("int4_gpus", f64::from(g4.unwrap_or(0)))]),
        claim: format!("int4 takes a 70B model from 2 x {gpu} to one"),
        article: "2 x A100-80GB -> 1".into(),
        simulated: format!(
            "fp16: {} GPUs ({}); int4: {} ({})",
            show(g16),
            kv_room("fp16", g16)?,
            show(g4),
            kv_room("int4", g4)?
        ),
        verdict: Verdict::holds_if(g16 == Some(2) && g4 == Some(1)),
        why: "the memory plan (weights, activations, runtime reserve within gpu_memory_utilization) must leave room for one max-length sequence; fp16 on two GPUs leaves little KV, int4 on one leaves more".into(),
    });

    // Decode speed-ups at the lightest and the heaviest load.
    let runs = ctx.sweep()?;
    let (lo, hi) = ctx.ends(&runs)?;
    let label = |p: usize| point_label(&runs, p);
    let speed = |p: usize, name: &str| -> Result<f64, SimError> {
        match (tpot(&runs, p, "fp16"), tpot(&runs, p, name)) {
            (Some(a), Some(b)) if b > 0.0 => Ok(a / b),
            _ => Err(ctx.error(format!("no runs of fp16 and {name} at every point"))),
        }
    };
    let (s8, s4) = (speed(lo, "int8")?, speed(lo, "int4")?);
    let (h8, h4) = (speed(hi, "int8")?, speed(hi, "int4")?);
    let holds_lo = within(s8, 1.5, 2.0, 0.1) && within(s4, 2.0, 3.0, 0.1);
    let holds_hi = within(h8, 1.5, 2.0, 0.1) && within(h4, 2.0, 3.0, 0.1);
    rows.push(ClaimRow {
        scenario: String::new(),
        figures: figs(&[("int8_speedup_low", s8), ("int4_speedup_low", s4), ("int8_speedup_high", h8), ("int4_speedup_high", h4)]),
        claim: "int8 and int4 weights speed decoding up".into(),
        article: "int8 ~1.5x (1.5-2x), int4 ~2.5x (2-3x)".into(),
        simulated: format!(
            "TPOT speed-up at {}: int8 {}, int4 {}; at {}: int8 {}, int4 {}",
            label(lo),
            times(s8),
            times(s4),
            label(hi),
            times(h8),
            times(h4)
        ),
        verdict: match (holds_lo, holds_hi) {
            (true, true) => Verdict::Holds,
            (true, false) => Verdict::HoldsOnlyWhen(
                "batches are small (decode reads the weights once per step)".into(),
            ),
            _ => Verdict::DoesNotHold,
        },
        why: "a decode step streams every weight once, so fewer bytes per weight shorten it while it is memory-bound; at large batches the GEMMs become compute-bound and weight-only formats dequantize to 16 bits, so the gain shrinks".into(),
    });
    Ok(rows)
}
