//! Claim 8: the articles' first-pass capacity formula, replicas = ceil(peak req/s x
//! output tokens / measured tokens/s per replica), against `sim plan`, which counts
//! prefill, prompt lengths and queueing under an SLO; and the advice to test a
//! prefill-heavy and a decode-heavy workload apart.
//!
//! In: `capacity.toml`, variant `replica` swept over the workload (the point with the
//! shortest prompts is the decode-heavy one), the scenario's arrival rate as the peak and
//! its `[slo]`. Each point is run saturated (the formula's measured tokens/s) and planned
//! ([`crate::plan::plan`]). Out: a row per
//! workload, and one for sizing the prefill-heavy traffic from the decode-heavy benchmark.

use super::{figs, summary, ClaimRow, Ctx, Verdict};
use crate::plan::{plan, PlanInputs};
use crate::workload::ArrivalConfig;
use crate::SimError;

pub(super) fn evaluate(ctx: &Ctx<'_>) -> Result<Vec<ClaimRow>, SimError> {
    ctx.variant("replica")?;
    let peak = match ctx.scn.base.workload.arrival {
        Some(ArrivalConfig::Poisson { rate }) | Some(ArrivalConfig::Gamma { rate, .. }) => rate,
        _ => {
            return Err(ctx.error(
                "workload.arrival: the claim needs the peak as a Poisson or gamma rate".into(),
            ))
        }
    };
    let points = ctx.scn.sweep_points();
    if points.len() < 2 {
        return Err(ctx.error(
            "the claim needs a [sweep] of at least two workloads (a decode-heavy and a prefill-heavy one)".into(),
        ));
    }
    let mut found = Vec::new();
    for (i, p) in points.iter().enumerate() {
        let scn = ctx.scn.at_point(p)?;
        let v = scn
            .variants
            .iter()
            .find(|v| v.name == "replica")
            .ok_or_else(|| ctx.error("the claim needs a variant named `replica`".into()))?;
        // Saturated, as a throughput benchmark measures: a closed loop keeping
        // max_num_seqs requests in flight, long enough (4x the scenario's requests) that
        // the drain at the end weighs little.
        let mut sat = scn.clone();
        for v in &mut sat.variants {
            let w = &mut v.config.workload;
            w.arrival = Some(ArrivalConfig::ClosedLoop {
                concurrency: v.scheduler.max_num_seqs,
                think_time_s: 0.0,
                ramp_up_s: 0.0,
                think_jitter_s: 0.0,
            });
            w.num_requests = Some(4 * ctx.requests().or(w.num_requests).unwrap_or(400));
            w.duration_s = None;
        }
        let saturated = ctx.run_scenario(&sat, &["replica"], &format!("saturated-{i}"))?;
        let s = summary(&saturated, "replica")?;
        let mean_in = s.total_input_tokens as f64 / (s.completed.max(1) as f64);
        let mean_out = s.total_output_tokens as f64 / (s.completed.max(1) as f64);
        let mut planned = scn.clone();
        planned.base = v.config.clone();
        let rows = plan(
            &planned,
            &PlanInputs {
                target_rate: peak,
                gpus: vec![v.deployment.gpu.name.to_string()],
                tps: vec![v.deployment.tp],
                dtypes: vec![v.deployment.dtype],
                // As `sim plan` runs by default: its steady-state check, not a longer
                // probe, keeps long requests from overrating a replica.
                requests: ctx
                    .requests()
                    .unwrap_or(crate::plan::DEFAULT_PROBE_REQUESTS),
                prices: Vec::new(),
            },
        )?;
        let Some(row) = rows.into_iter().next() else {
            return Err(ctx.error("`sim plan` gave no row".into()));
        };
        if let Some(why) = &row.skipped {
            return Err(ctx.error(why.clone()));
        }
        found.push((mean_in, s.output_throughput, mean_out, row));
    }
    // Decode-heavy first: the shortest prompts.
    found.sort_by(|a, b| a.0.total_cmp(&b.0));
    let name = |i: usize, mean_in: f64| {
        let kind = if i == 0 {
            "decode-heavy"
        } else {
            "prefill-heavy"
        };
        format!("{kind} ({mean_in:.0}-token prompts)")
    };
    let formula = |tps: f64, out: f64| (peak * out / tps.max(1e-9)).ceil() as u32;
    let slo = &ctx.scn.base.slo;
    let slo_text = format!(
        "p90 TTFT <= {} ms, p99 TPOT <= {} ms",
        slo.ttft_ms.unwrap_or(f64::INFINITY),
        slo.tpot_ms.unwrap_or(f64::INFINITY)
    );
    let mut rows = Vec::new();
    for (i, (mean_in, tps, out, p)) in found.iter().enumerate() {
        let n = name(i, *mean_in);
        let f = formula(*tps, *out);
        rows.push(ClaimRow {
            scenario: String::new(),
            figures: figs(&[("formula", f64::from(f)), ("planned", f64::from(p.replicas)), ("max_rate", p.max_rate)]),
            claim: format!("replicas for {peak} req/s of {n} traffic"),
            article: "ceil(20 x 300 / 1200) = 5: a first estimate, not the fleet".into(),
            simulated: format!(
                "formula: ceil({peak} x {out:.0} / {tps:.0} tok/s) = {f}; sim plan: {} (a replica sustains {:.1} req/s within {slo_text})",
                p.replicas, p.max_rate
            ),
            verdict: if p.replicas <= f {
                Verdict::Holds
            } else {
                Verdict::HoldsOnlyWhen("no latency bound applies (saturated throughput is what it divides by)".into())
            },
            why: if p.replicas <= f {
                "short prompts cost little prefill, so a replica meets the SLO close to its saturated throughput: the formula's estimate suffices (rounding up gives the headroom)"
            } else {
                "the formula divides by a saturated replica's throughput, at which queues break any TTFT bound; long prompts make each replica's SLO-bound rate far lower"
            }
            .into(),
        });
    }
    // Sizing prefill-heavy traffic from the decode-heavy benchmark.
    let (_, dtps, _, _) = &found[0];
    let (_, _, pout, pp) = &found[found.len() - 1];
    let from_decode = formula(*dtps, *pout);
    rows.push(ClaimRow {
        scenario: String::new(),
        figures: figs(&[("from_decode_benchmark", f64::from(from_decode)), ("planned", f64::from(pp.replicas))]),
        claim: "benchmark prefill-heavy and decode-heavy traffic apart".into(),
        article: "\"If you only benchmark one synthetic prompt, you will choose the wrong configuration.\"".into(),
        simulated: format!(
            "prefill-heavy traffic sized from the decode-heavy benchmark: {from_decode} replica(s); it needs {}",
            pp.replicas
        ),
        verdict: Verdict::holds_if(pp.replicas > from_decode),
        why: "the output tokens/s of a decode-heavy benchmark carry almost no prefill; long prompts spend most of a replica's compute before the first output token".into(),
    });
    Ok(rows)
}
