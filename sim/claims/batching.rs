//! Claim 4: continuous batching's "10-20x higher throughput" than static batching, and
//! against which static baseline, output-length spread and load it holds.
//!
//! In: `batching.toml`, variants `naive-static` (padded batches, max-length KV),
//! `static-paged` and `continuous`, swept over the load (`workload.arrival.rate`) and the
//! spread of output lengths. Out: one row per baseline, with the output-throughput ratio
//! at every point and the points where it reaches the claim. Measured on a real runtime
//! (`cpu/batching.toml`), which does not execute padding, only `static-paged` is compared.

use super::{at, point_label, sweep_points, times, ClaimRow, Ctx, Verdict};
use crate::sweep::SweepRun;
use crate::SimError;

/// One point's ratio of continuous over `baseline` output throughput.
struct Point {
    /// `key=value` of each swept key.
    label: String,
    ratio: f64,
    /// Whether the baseline kept up with the offered load (it completes what it is sent,
    /// so a baseline that keeps up gives the same throughput as any other).
    saturated: bool,
}

fn points(runs: &[SweepRun], baseline: &str) -> Vec<Point> {
    let mut out = Vec::new();
    for p in sweep_points(runs) {
        let (Ok(c), Ok(b)) = (at(runs, p, "continuous"), at(runs, p, baseline)) else {
            continue;
        };
        out.push(Point {
            label: point_label(runs, p),
            ratio: c.output_throughput / b.output_throughput.max(1e-9),
            // Queueing longer than the mean service means the baseline fell behind.
            saturated: b.mean_queue_ms > b.mean_e2el_ms * 0.5,
        });
    }
    out
}

fn row(points: &[Point], baseline: &str, why: &str) -> ClaimRow {
    let (lo, hi) = (10.0, 20.0);
    let listed = points
        .iter()
        .map(|p| format!("{}: {}", p.label, times(p.ratio)))
        .collect::<Vec<_>>()
        .join("; ");
    let reach: Vec<&Point> = points.iter().filter(|p| p.ratio >= lo * 0.9).collect();
    let verdict = if reach.len() == points.len() && !points.is_empty() {
        Verdict::Holds
    } else if reach.is_empty() {
        Verdict::DoesNotHold
    } else {
        let sat = reach.iter().all(|p| p.saturated);
        Verdict::HoldsOnlyWhen(format!(
            "{} (the baseline {}saturated)",
            reach
                .iter()
                .map(|p| p.label.as_str())
                .collect::<Vec<_>>()
                .join("; "),
            if sat { "" } else { "nearly " }
        ))
    };
    ClaimRow {
        scenario: String::new(),
        figures: points.iter().map(|p| (p.label.clone(), p.ratio)).collect(),
        claim: format!("continuous batching's throughput over {baseline}"),
        article: format!("{lo:.0}-{hi:.0}x"),
        simulated: listed,
        verdict,
        why: why.into(),
    }
}

pub(super) fn evaluate(ctx: &Ctx<'_>) -> Result<Vec<ClaimRow>, SimError> {
    // Real runtimes do not execute padding: measured, the naive baseline is left out.
    let naive_too = !ctx.measured();
    let needed: &[&str] = if naive_too {
        &["naive-static", "static-paged", "continuous"]
    } else {
        &["static-paged", "continuous"]
    };
    for v in needed {
        ctx.variant(v)?;
    }
    let runs = ctx.sweep()?;
    let naive = points(&runs, "naive-static");
    let paged = points(&runs, "static-paged");
    if paged.is_empty() || (naive_too && naive.is_empty()) {
        return Err(ctx.error("the sweep ran no point with every variant".into()));
    }
    let mut rows = Vec::new();
    if naive_too {
        rows.push(row(
            &naive,
            "naive static batching (HF generate: padding, max-length KV)",
            "below saturation every scheduler serves what arrives, so throughput is the offered load; a naive batch computes every member's padding and pad rows until its longest output ends, attends over the padded context and copies its whole cache each step (HF's DynamicCache), and max-length KV caps how many requests a batch holds: it saturates at a fraction of the load a continuous batcher carries",
        ));
    }
    rows.push(row(
        &paged,
        "static batching with paged KV",
        if naive_too {
            "without padding and with KV sized to each request, a static batch loses only the idle slots of finished members until the longest ends: the gap grows with the spread of output lengths but stays a small multiple"
        } else {
            "a static batch loses the idle slots of its finished members until the longest ends; on a CPU a decode step's time grows nearly with its tokens (compute-bound: about 2.5x the tokens/s at 16 sequences as at 1, BENCHMARKS.md), so fuller batches buy little and continuous batching gains little"
        },
    ));
    Ok(rows)
}
