//! `sim calibrate --observed`: seven of the cost model's terms fitted per engine to
//! aiconfigurator's measured deployments, with k-fold held-out errors: the overhead of
//! every step (`cost.step_overhead_us`) and the latency of each tensor-parallel all-reduce
//! (`cost.allreduce_latency_us`), both of which TPOT shows, the host's time per layer of a
//! step run outside CUDA graphs (`cost.eager_layer_us`: a floor under every step that
//! prefills) together with the engine's own fp8 and NVFP4 GEMM efficiencies on each GPU
//! (`[cost.by_gpu.<gpu>] fp8_compute_eff`, `fp4_compute_eff`: each engine runs its own
//! low-precision kernels, and they reach different fractions of a Hopper's and a
//! Blackwell's peak), the engine's all-reduce efficiency on each GPU
//! (`[cost.by_gpu.<gpu>] allreduce_eff`: its fused or custom all-reduce may fall back to
//! NCCL at a prefill's sizes), and the per-request front end (`cost.request_overhead_ms`),
//! which TTFT shows.
//!
//! Every simulable row of an engine is simulated once per candidate it can feel (the
//! closed loop of [`crate::cost_model::validation::silicon`]): rows without fp8 (fp4)
//! weights keep their errors under the fp8 (fp4) candidates, rows at TP 1 under the
//! all-reduce ones. Per fold, the step overhead with the smallest median absolute TPOT
//! error on the other folds is chosen, then, with it, the all-reduce latency, then, with
//! both, each GPU's eager floor and fp8 and fp4 efficiencies with the smallest sum of
//! the median absolute TTFT and TPOT errors (the floor moves TTFT, the efficiencies both;
//! each GPU's floor is chosen on its own rows, since the host's launch time is that of the
//! GPU's hosts, and written as `[cost] eager_layer_us` where it is the floor of the most
//! rows, else as `[cost.by_gpu.<gpu>] eager_layer_us`; each GPU's fp8 and fp4
//! efficiencies are chosen on its own rows with fp8 or fp4 weights), then each GPU's
//! all-reduce efficiency on its own rows at TP > 1 (the same score), then the front-end
//! cost with the smallest median absolute TTFT error (one stage at a time, so the grid
//! stays small), and last, per campaign (one engine version, model and GPU, which one
//! harness measured on one host), a [`CampaignChoice`]: a setting of the benchmark its rows
//! do not record ([`Unrecorded`]: a held slot, repeated prompts, a step of one prompt)
//! together with the campaign's own eager floor, then a serial front end, each taken only
//! where the campaign's training rows fit it better and a k-fold inside them says the
//! choice holds out; the held-out fold's errors under that fit are kept. Reported errors
//! are those held-out errors; the spread of the fold fits is the fit's uncertainty. The fit
//! on all rows is what the calibration file carries.

use std::collections::HashMap;

use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::memo::memo_pass;
use crate::cost_model::validation::silicon::{self, silicon_checks_with, EngineCost, Unrecorded};
use crate::observed::silicon::AggregateRow;

/// The serial front end's times per streamed update a campaign may take, microseconds
/// (`cost.frontend_update_us`; none is the campaign's pass before): 25,000, 12,500 and
/// 9,100 updates a second. SGLang 0.5.6's Llama-3.1-8B rows at 512 clients deliver up to
/// 19,600 tokens a second at TP4 and TP8 (clients x output / (TTFT + (output - 1) x TPOT)),
/// and TensorRT-LLM 1.0.0rc3's at 128 clients up to 9,200 at TP2, TP4 and TP8 alike: a
/// ceiling no TP raises, which 80 us an update, taken from the clients' count over TPOT as
/// if all of them streamed, did not reach.
pub const FRONTEND_CANDIDATES_US: [f64; 3] = [40.0, 80.0, 110.0];

/// The front-end costs tried, milliseconds (the first, none, is the stage before's pass).
pub const CANDIDATES_MS: [f64; 8] = [0.0, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0];
const _: () = assert!(CANDIDATES_MS[0] == 0.0);

/// The step overheads tried, microseconds (up to 5 ms: vLLM's rows chose the largest
/// when 2.5 ms was the last).
pub const STEP_CANDIDATES_US: [f64; 10] = [
    0.0, 100.0, 300.0, 600.0, 1000.0, 1500.0, 2000.0, 2500.0, 3500.0, 5000.0,
];

/// The all-reduce latencies tried, microseconds (`None`: the GPU catalog's, or the
/// framework's custom all-reduce for small messages): tensor parallelism's cost per layer,
/// which TPOT shows growing with the TP degree.
pub const ALLREDUCE_CANDIDATES_US: [Option<f64>; 4] = [None, Some(15.0), Some(25.0), Some(40.0)];

/// The host times per layer of an eager step tried, microseconds (0: no floor). A 70B
/// model's 80 layers at 1,000 us floor its prefill steps at 80 ms.
pub const EAGER_CANDIDATES_US: [f64; 6] = [0.0, 300.0, 600.0, 900.0, 1200.0, 1500.0];

/// The engine's fp8 GEMM efficiencies tried on each GPU with each eager floor, relative to
/// the 16-bit GEMMs' (`None`: the kernels' fit over every engine, `cost.fp8_compute_eff`'s
/// default). Only rows with fp8 weights feel it.
pub const FP8_CANDIDATES: [Option<f64>; 4] = [None, Some(0.5), Some(0.7), Some(0.8)];
// The first, the default, is what rows without fp8 weights keep under every candidate.
const _: () = assert!(FP8_CANDIDATES[0].is_none());

/// The engine's NVFP4 GEMM efficiencies tried on each GPU with each eager floor, relative to
/// the 16-bit GEMMs' (`None`: the kernels' fit over every engine, `cost.fp4_compute_eff`'s
/// default, 0.4, or what the same run's `fp4` stage fitted). Only rows with fp4 weights on
/// a GPU with fp4 tensor cores feel it.
pub const FP4_CANDIDATES: [Option<f64>; 5] = [None, Some(0.3), Some(0.5), Some(0.6), Some(0.8)];
// The first, the default, is what rows without fp4 weights keep under every candidate.
const _: () = assert!(FP4_CANDIDATES[0].is_none());

/// The all-reduce efficiencies (fractions of the link's bandwidth) tried on each GPU after
/// the eager floor (`None`: the GPU catalog's, fitted to NCCL's profiles). An engine's
/// all-reduce can fall back from its fused or custom kernels to NCCL at the sizes a
/// prefill moves (vLLM's FlashInfer fusion stops at 32 MB on B200s), which only TTFT at
/// TP > 1 shows.
pub const ALLREDUCE_EFF_CANDIDATES: [Option<f64>; 4] = [None, Some(0.6), Some(0.45), Some(0.3)];
// The first, the catalog's, is the eager stage's pass.
const _: () = assert!(ALLREDUCE_EFF_CANDIDATES[0].is_none());

/// The engine's efficiencies on each GPU where they depart from the defaults, each list
/// `(catalog GPU, value)` by GPU name: written as `[cost.by_gpu.<gpu>]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ByGpu {
    /// `fp8_compute_eff`.
    pub fp8: Vec<(&'static str, f64)>,
    /// `fp4_compute_eff`.
    pub fp4: Vec<(&'static str, f64)>,
    /// `allreduce_eff`.
    pub allreduce: Vec<(&'static str, f64)>,
    /// `eager_layer_us`, where a GPU's floor departs from the `[cost]` one.
    pub eager: Vec<(&'static str, f64)>,
}

impl ByGpu {
    /// From each GPU's candidate indices (into [`FP8_CANDIDATES`], [`FP4_CANDIDATES`] and
    /// [`ALLREDUCE_EFF_CANDIDATES`]), keeping the ones that depart from the default.
    fn of(
        fp8: &[(&'static str, usize)],
        fp4: &[(&'static str, usize)],
        allreduce: &[(&'static str, usize)],
    ) -> ByGpu {
        let pick = |choice: &[(&'static str, usize)], table: &[Option<f64>]| {
            choice
                .iter()
                .filter_map(|&(g, c)| table[c].map(|e| (g, e)))
                .collect()
        };
        ByGpu {
            fp8: pick(fp8, &FP8_CANDIDATES),
            fp4: pick(fp4, &FP4_CANDIDATES),
            allreduce: pick(allreduce, &ALLREDUCE_EFF_CANDIDATES),
            eager: Vec::new(),
        }
    }

    /// Each GPU named, once, by name, with its keys as TOML `key = value` pairs.
    fn tables(&self) -> Vec<(&'static str, Vec<String>)> {
        let mut out: Vec<(&'static str, Vec<String>)> = Vec::new();
        for (list, key) in [
            (&self.fp8, "fp8_compute_eff"),
            (&self.fp4, "fp4_compute_eff"),
            (&self.allreduce, "allreduce_eff"),
            (&self.eager, "eager_layer_us"),
        ] {
            for &(g, e) in list {
                let kv = if key == "eager_layer_us" {
                    format!("{key} = {e:.1}")
                } else {
                    format!("{key} = {e:.2}")
                };
                match out.iter_mut().find(|(n, _)| *n == g) {
                    Some((_, keys)) => keys.push(kv),
                    None => out.push((g, vec![kv])),
                }
            }
        }
        out.sort_by_key(|(g, _)| *g);
        out
    }

    /// As an inline TOML table (`{ b200 = { fp8_compute_eff = 0.50, allreduce_eff = 0.30 } }`).
    fn inline(&self) -> String {
        let entries: Vec<String> = self
            .tables()
            .iter()
            .map(|(g, keys)| format!("{g} = {{ {} }}", keys.join(", ")))
            .collect();
        format!("{{ {} }}", entries.join(", "))
    }

    /// As `[cost.by_gpu.<gpu>]` tables.
    fn toml_tables(&self) -> String {
        self.tables()
            .iter()
            .map(|(g, keys)| format!("\n[cost.by_gpu.{g}]\n{}\n", keys.join("\n")))
            .collect()
    }

    /// `fp8 b200 0.50, h200 0.70 / fp4 b200 0.60 / all-reduce eff b200 0.30`, or
    /// `default fp8 / default fp4 / default all-reduce eff`.
    fn describe(&self) -> String {
        let list = |v: &[(&str, f64)], what: &str| {
            if v.is_empty() {
                return format!("default {what}");
            }
            let entries: Vec<String> = v.iter().map(|(g, e)| format!("{g} {e:.2}")).collect();
            format!("{what} {}", entries.join(", "))
        };
        let eager: Vec<String> = self
            .eager
            .iter()
            .map(|(g, us)| format!(" / eager {g} {us:.0} us"))
            .collect();
        format!(
            "{} / {} / {}{}",
            list(&self.fp8, "fp8"),
            list(&self.fp4, "fp4"),
            list(&self.allreduce, "all-reduce eff"),
            eager.concat()
        )
    }

    fn is_empty(&self) -> bool {
        self.fp8.is_empty()
            && self.fp4.is_empty()
            && self.allreduce.is_empty()
            && self.eager.is_empty()
    }
}

/// What a candidate is chosen on: the median absolute error of TTFT, of TPOT, or their sum
/// with the TTFT's median weighted (`Weighted(w)`: w x TTFT's + TPOT's; [`Score::BOTH`],
/// w = 1, the plain sum).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Score {
    Ttft,
    Tpot,
    Weighted(f64),
}

impl Score {
    /// The plain sum of the two medians.
    const BOTH: Score = Score::Weighted(1.0);
}

/// An engine's efficiencies on one GPU in a candidate (`None`: the defaults').
#[derive(Debug, Clone, Copy, Default)]
struct Effs {
    fp8: Option<f64>,
    fp4: Option<f64>,
    allreduce: Option<f64>,
}

/// The cost terms of one candidate of an engine's fit over the shared terms `prior` (an
/// efficiency the candidate leaves `None` keeps `prior`'s).
fn candidate(
    step_us: f64,
    allreduce_us: Option<f64>,
    eager_us: f64,
    request_ms: f64,
    effs: Effs,
    prior: &EngineCost,
) -> EngineCost {
    EngineCost {
        step_overhead_us: Some(step_us),
        request_overhead_ms: Some(request_ms),
        allreduce_latency_us: allreduce_us,
        eager_layer_us: Some(eager_us),
        fp8_compute_eff: effs.fp8.or(prior.fp8_compute_eff),
        fp4_compute_eff: effs.fp4.or(prior.fp4_compute_eff),
        allreduce_eff: effs.allreduce.or(prior.allreduce_eff),
        ..*prior
    }
}

/// What one campaign's rows are simulated with beyond its engine's fit: a setting of the
/// benchmark they do not record, and the campaign's own eager floor and serial front end
/// (`None`: the fit's floor for the GPU, no front end). The host's launch time and the
/// front end's throughput are the campaign's host's, which no row records.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CampaignChoice {
    /// The benchmark's setting.
    pub setting: Unrecorded,
    /// `cost.eager_layer_us` for the campaign's rows.
    pub eager_layer_us: Option<f64>,
    /// `cost.frontend_update_us` for the campaign's rows.
    pub frontend_update_us: Option<f64>,
}

impl CampaignChoice {
    /// `held-slot, eager floor 600 us, front end 80 us an update`.
    pub fn describe(&self) -> String {
        let mut text = self.setting.name().to_string();
        if let Some(us) = self.eager_layer_us {
            text += &format!(", eager floor {us:.0} us");
        }
        if let Some(us) = self.frontend_update_us {
            text += &format!(", front end {us:.0} us an update");
        }
        text
    }
}

/// One fold's fit.
#[derive(Debug, Clone, PartialEq)]
pub struct FoldFit {
    /// `cost.step_overhead_us`.
    pub step_overhead_us: f64,
    /// `cost.allreduce_latency_us` (`None`: the defaults').
    pub allreduce_latency_us: Option<f64>,
    /// `cost.eager_layer_us`.
    pub eager_layer_us: f64,
    /// `cost.request_overhead_ms`.
    pub request_overhead_ms: f64,
    /// `[cost.by_gpu.<gpu>]` `fp8_compute_eff`, `fp4_compute_eff`, `allreduce_eff` and
    /// `eager_layer_us` (GPUs not listed: the defaults, and `eager_layer_us` above).
    pub by_gpu: ByGpu,
    /// The campaigns simulated with a choice of their own ([`CampaignChoice`]; the others
    /// as recorded under the fit), by campaign ([`campaign_of`]).
    pub unrecorded: Vec<(String, CampaignChoice)>,
}

impl FoldFit {
    /// `1500 us / 25 us all-reduce / 600 us eager layer / fp8 b200 0.50 / 40 ms`.
    fn describe(&self) -> String {
        let ar = self
            .allreduce_latency_us
            .map_or("default all-reduce".to_string(), |a| {
                format!("{a:.0} us all-reduce")
            });
        let effs = self.by_gpu.describe();
        format!(
            "{:.0} us / {ar} / {:.0} us eager layer / {effs} / {:.0} ms{}",
            self.step_overhead_us,
            self.eager_layer_us,
            self.request_overhead_ms,
            describe_unrecorded(&self.unrecorded)
        )
    }

    /// The `[cost]` keys, as an inline TOML table.
    fn inline_table(&self) -> String {
        let ar = self.allreduce_latency_us.map_or(String::new(), |a| {
            format!(", allreduce_latency_us = {a:.1}")
        });
        let fp8 = if self.by_gpu.is_empty() {
            String::new()
        } else {
            format!(", by_gpu = {}", self.by_gpu.inline())
        };
        format!(
            "{{ step_overhead_us = {:.1}{ar}, eager_layer_us = {:.1}, request_overhead_ms = {:.1}{fp8} }}",
            self.step_overhead_us, self.eager_layer_us, self.request_overhead_ms
        )
    }
}

/// One engine's fit.
#[derive(Debug, Clone)]
pub struct EngineFit {
    /// Engine (`vllm`, `sglang`, `trtllm`).
    pub engine: String,
    /// Rows fitted.
    pub rows: usize,
    /// The front-end cost fitted on every row (ms).
    pub request_overhead_ms: f64,
    /// The step overhead fitted on every row (us).
    pub step_overhead_us: f64,
    /// The all-reduce latency fitted on every row (us; `None`: the defaults').
    pub allreduce_latency_us: Option<f64>,
    /// The eager step's host time per layer fitted on every row (us).
    pub eager_layer_us: f64,
    /// The engine's fp8 and fp4 GEMM and all-reduce efficiencies on each GPU, fitted on
    /// every row.
    pub by_gpu: ByGpu,
    /// The campaigns simulated with a choice of their own, chosen on every row.
    pub unrecorded: Vec<(String, CampaignChoice)>,
    /// Each fold's fit.
    pub fold_fits: Vec<FoldFit>,
    /// Held-out signed TTFT errors (one per row).
    pub held_out_ttft: Vec<f64>,
    /// Held-out signed TPOT errors (one per row).
    pub held_out_tpot: Vec<f64>,
    /// TTFT errors with the framework's defaults and no front-end cost (the baseline).
    pub baseline_ttft: Vec<f64>,
    /// TPOT errors with the framework's defaults (the baseline).
    pub baseline_tpot: Vec<f64>,
    /// The rows' ids, by index (the baselines' order).
    pub ids: Vec<String>,
    /// The catalog GPU of each row, by index.
    pub gpus: Vec<&'static str>,
    /// `(row index, fold)` of each held-out error, in the order of `held_out_ttft`.
    pub held_out_rows: Vec<(usize, usize)>,
    /// Row simulations the fit ran, and those it read from kept passes instead
    /// ([`super::memo`]).
    pub passes: (u64, u64),
}

impl EngineFit {
    /// Whether the fit lost to the defaults held out ([`loses_to_defaults`]): its file then
    /// keeps the defaults, and what it quotes and lists are the defaults' errors.
    pub fn kept_defaults(&self) -> bool {
        loses_to_defaults(
            (&self.held_out_ttft, &self.held_out_tpot),
            (&self.baseline_ttft, &self.baseline_tpot),
        )
    }
}

/// Whether a fit whose held-out errors are `held` does worse than the defaults' errors
/// `base` on the same rows: the sum of its TTFT and TPOT median |error| (what the stages
/// choose by) is not below theirs. The k-fold errors are the only unbiased view of the fit
/// procedure, so they decide whether its file is worth shipping; the defaults' errors are
/// not held out of the kernels' fits, which saw these rows too.
pub fn loses_to_defaults(held: (&[f64], &[f64]), base: (&[f64], &[f64])) -> bool {
    let score = |(t, p): (&[f64], &[f64])| median_abs(t) + median_abs(p);
    score(held) >= score(base)
}

/// The 90th percentile of the absolute values.
pub fn p90_abs(v: &[f64]) -> f64 {
    let a: Vec<f64> = v.iter().map(|x| x.abs()).collect();
    analysis::percentile(&a, 90.0)
}

/// What a fit file's header quotes, in percent: the held-out TTFT median and 90th-percentile
/// |error| and the baseline's (the defaults' or the shared terms') median, then the same of
/// TPOT.
pub(crate) struct HeldOutFigures {
    pub t: f64,
    pub t90: f64,
    pub bt: f64,
    pub p: f64,
    pub p90: f64,
    pub bp: f64,
}

impl HeldOutFigures {
    /// The header's sentence: "TTFT median |err| 10.7%, p90 55.2%`gap[0]`(defaults: 19.6%),
    /// `gap[1]`TPOT median |err| ...", `baseline` naming what the parentheses hold and the
    /// gaps where each file breaks its lines.
    pub(crate) fn quote(&self, baseline: &str, gap: [&str; 2]) -> String {
        format!(
            "TTFT median |err| {:.1}%, p90 {:.1}%{}({baseline}: {:.1}%),{}TPOT median |err| {:.1}%, p90 {:.1}% ({baseline}: {:.1}%)",
            self.t, self.t90, gap[0], self.bt, gap[1], self.p, self.p90, self.bp
        )
    }
}

/// [`HeldOutFigures`] of held-out `(TTFT, TPOT)` signed errors beside the baseline's.
pub(crate) fn held_out_figures(
    (ttft, tpot): (&[f64], &[f64]),
    (base_ttft, base_tpot): (&[f64], &[f64]),
) -> HeldOutFigures {
    HeldOutFigures {
        t: 100.0 * median_abs(ttft),
        t90: 100.0 * p90_abs(ttft),
        bt: 100.0 * median_abs(base_ttft),
        p: 100.0 * median_abs(tpot),
        p90: 100.0 * p90_abs(tpot),
        bp: 100.0 * median_abs(base_tpot),
    }
}

/// `(TTFT, TPOT)` signed errors of an engine's rows under one candidate.
pub(super) type Errors = Vec<(f64, f64)>;

/// Each GPU's candidate, an index into a table of candidates (e.g. [`FP8_CANDIDATES`]), by
/// GPU name.
type PerGpu = Vec<(&'static str, usize)>;

/// The median of the absolute values.
pub fn median_abs(v: &[f64]) -> f64 {
    let a: Vec<f64> = v.iter().map(|x| x.abs()).collect();
    analysis::median(&a)
}

/// Every simulable row's TTFT and TPOT errors under `cost` (each GPU's terms), in the
/// rows' order.
#[cfg(test)]
fn pass(
    rows: &[AggregateRow],
    cost: &(dyn Fn(&str) -> EngineCost + Sync),
) -> Result<Errors, crate::SimError> {
    Ok(pass_with_lines(rows, cost)?.2)
}

/// A pass's ids, GPUs and errors by row, and each row's position by its line in the file.
pub(super) type LinedPass = (Vec<String>, Vec<&'static str>, Errors, HashMap<u64, usize>);

/// A pass's ids, GPUs and errors (the same rows, in the same order, under every candidate:
/// the terms fitted here do not change what fits in memory), with each simulated row's
/// position by its line in the file (what [`pass_moving`] splices by).
pub(super) fn pass_with_lines(
    rows: &[AggregateRow],
    cost: &(dyn Fn(&str) -> EngineCost + Sync),
) -> Result<LinedPass, crate::SimError> {
    let (done, _) = silicon_checks_with(rows, None, &|_, gpu| cost(gpu))?;
    Ok((
        done.iter().map(|k| k.row.id.clone()).collect(),
        done.iter().map(|k| k.gpu).collect(),
        done.iter()
            .map(|k| (k.ttft_error(), k.tpot_error()))
            .collect(),
        done.iter()
            .enumerate()
            .map(|(i, k)| (k.row.line, i))
            .collect(),
    ))
}

/// [`pass`] of only the rows among `rows` that `moves` picks, every other row keeping its
/// errors in `base` (indexed by the rows' lines, `index`): a row that cannot feel a
/// candidate (one without fp8 weights an fp8 efficiency, one at TP 1 an all-reduce's) is
/// not simulated again under it, which leaves the errors exactly as a full pass gives them.
pub(super) fn pass_moving(
    rows: &[AggregateRow],
    moves: &dyn Fn(&AggregateRow) -> bool,
    (index, base): (&HashMap<u64, usize>, &Errors),
    cost: &(dyn Fn(&str) -> EngineCost + Sync),
) -> Result<Errors, crate::SimError> {
    let picked: Vec<AggregateRow> = rows.iter().filter(|r| moves(r)).cloned().collect();
    let (done, _) = silicon_checks_with(&picked, None, &|_, gpu| cost(gpu))?;
    // The terms fitted here do not change which rows run (see `pass_with_ids`); a row that
    // runs under one candidate and not the other would leave its errors unmatched.
    let unmatched = |id: &str, line: u64| {
        crate::SimError::Scenario(crate::scenario::ScenarioError {
            file: format!("line {line}"),
            msg: format!("row `{id}` ran under one candidate of the fit but not under another"),
        })
    };
    if done.len()
        != picked
            .iter()
            .filter(|r| index.contains_key(&r.line))
            .count()
    {
        let ran: Vec<u64> = done.iter().map(|k| k.row.line).collect();
        if let Some(r) = picked
            .iter()
            .find(|r| index.contains_key(&r.line) && !ran.contains(&r.line))
        {
            return Err(unmatched(&r.id, r.line));
        }
    }
    let mut errors = base.clone();
    for k in &done {
        let i = *index
            .get(&k.row.line)
            .ok_or_else(|| unmatched(&k.row.id, k.row.line))?;
        errors[i] = (k.ttft_error(), k.tpot_error());
    }
    Ok(errors)
}

/// Whether a dense row's GEMMs run in fp8 (what `fp8_compute_eff` scales).
fn has_fp8_weights(row: &AggregateRow) -> bool {
    matches!(row.gemm_quant.as_str(), "fp8" | "fp8_block")
}

/// Whether a dense row's GEMMs run in NVFP4 (what `fp4_compute_eff` scales; gpt-oss's MXFP4
/// experts are a mixture of experts', not fitted here).
fn has_fp4_weights(row: &AggregateRow) -> bool {
    row.gemm_quant == "nvfp4"
}

/// Whether a dense row runs all-reduces (what the all-reduce terms cost).
fn all_reduces(row: &AggregateRow) -> bool {
    row.tp.unwrap_or(1) > 1
}

/// Each GPU's candidate (an index into `by_fp8`, whose entries are the rows' errors under
/// each candidate, e.g. of [`FP8_CANDIDATES`]): the one whose errors on `train`'s rows on
/// that GPU have the smallest sum of TTFT and TPOT medians, among the rows the candidates
/// move (rows without fp8 weights do not feel an fp8 efficiency, nor rows at TP 1 an
/// all-reduce's); 0 (the default) where no row moves. Returns the choice per GPU (`gpus`'
/// distinct names, sorted) and every row's errors under its GPU's choice. A key other than
/// a GPU's name groups the rows as finely (the MoE fit's GPU and expert format).
pub(super) fn per_gpu<K: Copy + Ord>(
    by_fp8: &[Errors],
    gpus: &[K],
    train: &[usize],
) -> (Vec<(K, usize)>, Errors) {
    per_group(by_fp8, gpus, train, Score::BOTH)
}

/// [`per_gpu`] with the TTFT's median weighted `ttft_weight` times the TPOT's in each
/// group's choice (1: their plain sum).
pub(super) fn per_gpu_weighted<K: Copy + Ord>(
    by: &[Errors],
    groups: &[K],
    train: &[usize],
    ttft_weight: f64,
) -> (Vec<(K, usize)>, Errors) {
    per_group(by, groups, train, Score::Weighted(ttft_weight))
}

/// [`per_gpu`] under the score `score`.
fn per_group<K: Copy + Ord>(
    by_fp8: &[Errors],
    gpus: &[K],
    train: &[usize],
    score: Score,
) -> (Vec<(K, usize)>, Errors) {
    let mut names: Vec<K> = gpus.to_vec();
    names.sort_unstable();
    names.dedup();
    let moved = |i: usize| by_fp8.iter().any(|e| e[i] != by_fp8[0][i]);
    let choice: Vec<(K, usize)> = names
        .iter()
        .map(|&g| {
            let rows: Vec<usize> = train
                .iter()
                .copied()
                .filter(|&i| gpus[i] == g && moved(i))
                .collect();
            let c = if rows.is_empty() {
                0
            } else {
                best(by_fp8, &rows, score)
            };
            (g, c)
        })
        .collect();
    let errors = under(by_fp8, &choice, gpus);
    (choice, errors)
}

/// Every row's errors under its GPU's candidate in `choice` (0 for a GPU not named): what
/// one pass with those per-GPU candidates gives, since a row feels only its own GPU's.
pub(super) fn under<K: Copy + PartialEq>(
    by: &[Errors],
    choice: &[(K, usize)],
    gpus: &[K],
) -> Errors {
    let of = |g: K| choice.iter().find(|(n, _)| *n == g).map_or(0, |c| c.1);
    (0..gpus.len()).map(|i| by[of(gpus[i])][i]).collect()
}

/// The value `choice` gives `gpu` from `table` (`None`: not named, or the default).
fn pick(choice: &[(&'static str, usize)], table: &[Option<f64>], gpu: &str) -> Option<f64> {
    choice
        .iter()
        .find(|(g, _)| *g == gpu)
        .and_then(|&(_, c)| table[c])
}

/// The candidates' errors computed for `key` (every key a fold chose was computed).
fn at<K: PartialEq, V>(table: &[(K, Vec<V>)], key: K) -> &[V] {
    &table
        .iter()
        .find(|(k, _)| *k == key)
        .expect("every fold's choice was simulated")
        .1
}

/// The candidate (index) whose errors have the smallest median absolute value on `train`
/// (of TTFT, TPOT or the sum of both medians, as `by` says).
fn best(errors: &[Errors], train: &[usize], by: Score) -> usize {
    let score = |c: usize| {
        let median = |ttft: bool| {
            let v: Vec<f64> = train
                .iter()
                .map(|&i| if ttft { errors[c][i].0 } else { errors[c][i].1 })
                .collect();
            median_abs(&v)
        };
        match by {
            Score::Ttft => median(true),
            Score::Tpot => median(false),
            Score::Weighted(w) => w * median(true) + median(false),
        }
    };
    (0..errors.len())
        .min_by(|&a, &b| score(a).total_cmp(&score(b)))
        .unwrap_or(0)
}

/// Fits the step overhead, the all-reduce latency, the eager floor with the engine's fp8
/// and fp4 efficiencies and the front-end cost per engine with `folds`-fold
/// cross-validation, over the shared terms `prior` (what the same `sim calibrate` run
/// fitted before, e.g. the fp8 and fp4 efficiencies over every engine's rows: an engine's
/// candidate `None` keeps them).
pub fn fit_engine_costs(
    rows: &[AggregateRow],
    folds: usize,
    prior: &EngineCost,
    passes: Option<&std::path::Path>,
) -> Result<Vec<EngineFit>, crate::SimError> {
    let folds = folds.max(2);
    let mut engines: Vec<String> = rows.iter().map(|r| r.backend.clone()).collect();
    engines.sort();
    engines.dedup();
    let mut fits = Vec::new();
    for engine in engines {
        let mine: Vec<AggregateRow> = rows
            .iter()
            .filter(|r| r.backend == engine)
            .cloned()
            .collect();
        let (ids, gpus, baseline, index) = pass_with_lines(&mine, &|_| *prior)?;
        let n = baseline.len();
        if n < folds {
            continue;
        }
        // Every pass below goes through the memo ([`super::memo`]): kept in `passes` when
        // given, else in memory (a pass it has seen is not simulated twice either way).
        let memo = std::cell::RefCell::new(match passes {
            Some(dir) => super::memo::Memo::open(dir, &engine, &mine)?,
            None => super::memo::Memo::in_memory(),
        });
        let gpu_of: HashMap<u64, &'static str> =
            index.iter().map(|(&l, &i)| (l, gpus[i])).collect();
        let mine_ref: &[AggregateRow] = &mine;
        // One pass at step overhead `s` and all-reduce latency `a` (candidate indices), an
        // eager floor, a front-end cost, and the efficiencies per GPU (`None`: the kernels'
        // fit, the catalog's).
        type EffsOf<'a> = &'a (dyn Fn(&str) -> Effs + Sync);
        type EagerOf<'a> = &'a (dyn Fn(&str) -> f64 + Sync);
        let run = |s: usize, a: usize, eager: EagerOf, request_ms: f64, eff: EffsOf| {
            memo_pass(&memo, mine_ref, &gpu_of, (&index, &baseline), &|gpu| {
                candidate(
                    STEP_CANDIDATES_US[s],
                    ALLREDUCE_CANDIDATES_US[a],
                    eager(gpu),
                    request_ms,
                    eff(gpu),
                    prior,
                )
            })
        };
        let none: EffsOf = &|_| Effs::default();
        // `run` over only the rows `moves` picks, the rest keeping `base`'s errors.
        let run_moving = |moves: &dyn Fn(&AggregateRow) -> bool,
                          base: &Errors,
                          s: usize,
                          a: usize,
                          eager: EagerOf,
                          eff: EffsOf| {
            let moving: Vec<AggregateRow> = mine.iter().filter(|r| moves(r)).cloned().collect();
            memo_pass(&memo, &moving, &gpu_of, (&index, base), &|gpu| {
                candidate(
                    STEP_CANDIDATES_US[s],
                    ALLREDUCE_CANDIDATES_US[a],
                    eager(gpu),
                    0.0,
                    eff(gpu),
                    prior,
                )
            })
        };
        // TPOT under each step overhead (no front-end cost: it barely moves TPOT).
        let mut by_step = Vec::new();
        for s in 0..STEP_CANDIDATES_US.len() {
            by_step.push(run(s, 0, &|_| 0.0, 0.0, none)?);
        }
        // A fixed shuffle, so folds mix GPUs, models and concurrencies.
        let mut idx: Vec<usize> = (0..n).collect();
        idx.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(17));
        let split = |f: usize| -> (Vec<usize>, Vec<usize>) {
            let test = (f..n).step_by(folds).map(|j| idx[j]).collect();
            let train = (0..n).filter(|j| j % folds != f).map(|j| idx[j]).collect();
            (test, train)
        };
        let step_of: Vec<usize> = (0..folds)
            .map(|f| best(&by_step, &split(f).1, Score::Tpot))
            .collect();
        let step_all = best(&by_step, &idx, Score::Tpot);
        // TPOT under each all-reduce latency, at every step overhead a fit chose (the
        // catalog's latency is `by_step` itself).
        let mut steps_needed: Vec<usize> = step_of.clone();
        steps_needed.push(step_all);
        steps_needed.sort_unstable();
        steps_needed.dedup();
        let mut by_ar: Vec<(usize, Vec<Errors>)> = Vec::new();
        for &s in &steps_needed {
            let mut errs = vec![by_step[s].clone()];
            for a in 1..ALLREDUCE_CANDIDATES_US.len() {
                errs.push(run_moving(&all_reduces, &by_step[s], s, a, &|_| 0.0, none)?);
            }
            by_ar.push((s, errs));
        }
        let ar_of: Vec<usize> = (0..folds)
            .map(|f| best(at(&by_ar, step_of[f]), &split(f).1, Score::Tpot))
            .collect();
        let ar_all = best(at(&by_ar, step_all), &idx, Score::Tpot);
        // Each eager floor with each fp8 and each fp4 efficiency on every GPU, at every
        // (step overhead, all-reduce) pair a fit chose (no floor at the default
        // efficiencies is `by_ar` itself).
        let mut pairs: Vec<(usize, usize)> = step_of.iter().copied().zip(ar_of.clone()).collect();
        pairs.push((step_all, ar_all));
        pairs.sort_unstable();
        pairs.dedup();
        let mut by_eager: Vec<((usize, usize), Vec<LowPrecision>)> = Vec::new();
        for &(s, a) in &pairs {
            let mut per_eager = Vec::new();
            for &us in &EAGER_CANDIDATES_US {
                // The default efficiencies first: the other candidates move only the rows
                // with fp8 (or fp4) weights from it.
                let base = if us == 0.0 {
                    at(&by_ar, s)[a].clone()
                } else {
                    run(s, a, &|_| us, 0.0, none)?
                };
                // `base`, then each candidate of `table` (`effs` of it on every GPU) over the
                // rows `moves` picks.
                let each = |table: &[Option<f64>],
                            moves: &dyn Fn(&AggregateRow) -> bool,
                            effs: fn(Option<f64>) -> Effs| {
                    let mut errs = vec![base.clone()];
                    for &eff in &table[1..] {
                        errs.push(run_moving(moves, &base, s, a, &|_| us, &|_| effs(eff))?);
                    }
                    Ok::<_, crate::SimError>(errs)
                };
                per_eager.push(LowPrecision {
                    fp8s: each(&FP8_CANDIDATES, &has_fp8_weights, |fp8| Effs {
                        fp8,
                        ..Effs::default()
                    })?,
                    fp4s: each(&FP4_CANDIDATES, &has_fp4_weights, |fp4| Effs {
                        fp4,
                        ..Effs::default()
                    })?,
                });
            }
            by_eager.push(((s, a), per_eager));
        }
        // Each GPU's floor is chosen on its own rows of `train` (the host's launch time is
        // its hosts'), the GPU's fp8 and fp4 efficiencies with it; a GPU without rows in
        // `train` takes the floor that scores best over all of them.
        let mut names: Vec<&'static str> = gpus.clone();
        names.sort_unstable();
        names.dedup();
        let eager_fit = |pair: (usize, usize), train: &[usize]| {
            let per_eager: Vec<(PerGpu, PerGpu, Errors)> = at(&by_eager, pair)
                .iter()
                .map(|lp| lp.fit(&gpus, train))
                .collect();
            let combined: Vec<Errors> = per_eager.iter().map(|c| c.2.clone()).collect();
            let global = best(&combined, train, Score::BOTH);
            let of = |c: &PerGpu, g: &str| c.iter().find(|(n, _)| *n == g).map_or(0, |x| x.1);
            let (mut e, mut c8, mut c4): (PerGpu, PerGpu, PerGpu) = Default::default();
            for &g in &names {
                let rows: Vec<usize> = train.iter().copied().filter(|&i| gpus[i] == g).collect();
                let k = if rows.is_empty() {
                    global
                } else {
                    best(&combined, &rows, Score::BOTH)
                };
                e.push((g, k));
                c8.push((g, of(&per_eager[k].0, g)));
                c4.push((g, of(&per_eager[k].1, g)));
            }
            (e, c8, c4)
        };
        // Every row's errors under its GPU's floor (`e`) and fp8 and fp4 choices.
        let eager_errors = |pair: (usize, usize), e: &PerGpu, c8: &PerGpu, c4: &PerGpu| {
            let lps = at(&by_eager, pair);
            let mut ks: Vec<usize> = e.iter().map(|x| x.1).collect();
            ks.sort_unstable();
            ks.dedup();
            let under_k: Vec<(usize, Errors)> = ks
                .iter()
                .map(|&k| (k, lps[k].under(c8, c4, &gpus)))
                .collect();
            (0..gpus.len())
                .map(|i| {
                    let k = e.iter().find(|x| x.0 == gpus[i]).map_or(0, |x| x.1);
                    under_k
                        .iter()
                        .find(|u| u.0 == k)
                        .map_or((0.0, 0.0), |u| u.1[i])
                })
                .collect::<Errors>()
        };
        let eager_us = |e: &PerGpu, gpu: &str| -> f64 {
            EAGER_CANDIDATES_US[e.iter().find(|x| x.0 == gpu).map_or(0, |x| x.1)]
        };
        // The `[cost]` floor (the one of the most rows) and the GPUs' departures from it.
        let shared_eager = |e: &PerGpu| -> (f64, Vec<(&'static str, f64)>) {
            let mut rows = vec![0usize; EAGER_CANDIDATES_US.len()];
            for &(g, k) in e {
                rows[k] += gpus.iter().filter(|&&x| x == g).count();
            }
            let shared = (0..rows.len())
                .max_by_key(|&k| (rows[k], std::cmp::Reverse(k)))
                .unwrap_or(0);
            let departs = e
                .iter()
                .filter(|x| x.1 != shared)
                .map(|&(g, k)| (g, EAGER_CANDIDATES_US[k]))
                .collect();
            (EAGER_CANDIDATES_US[shared], departs)
        };
        let eager_of: Vec<(PerGpu, PerGpu, PerGpu)> = (0..folds)
            .map(|f| eager_fit((step_of[f], ar_of[f]), &split(f).1))
            .collect();
        let eager_all = eager_fit((step_all, ar_all), &idx);
        // Each all-reduce efficiency on every GPU, at every (step overhead, all-reduce
        // latency, eager floor, fp8 and fp4 per GPU) a fit chose; then each GPU's, chosen on
        // its own rows at TP > 1 (the catalog's efficiency is the eager stage's pass).
        type Key = (usize, usize, PerGpu, PerGpu, PerGpu);
        let eager_key = |f: usize| -> Key {
            let (e, c8, c4) = eager_of[f].clone();
            (step_of[f], ar_of[f], e, c8, c4)
        };
        let eager_key_all: Key = (
            step_all,
            ar_all,
            eager_all.0.clone(),
            eager_all.1.clone(),
            eager_all.2.clone(),
        );
        let mut keys: Vec<Key> = (0..folds).map(eager_key).collect();
        keys.push(eager_key_all.clone());
        keys.sort();
        keys.dedup();
        let mut by_ar_eff: Vec<(Key, Vec<Errors>)> = Vec::new();
        for key in &keys {
            let (s, a, e, c8, c4) = key;
            let mut errs = vec![eager_errors((*s, *a), e, c8, c4)];
            for &ar in &ALLREDUCE_EFF_CANDIDATES[1..] {
                let moved = run_moving(
                    &all_reduces,
                    &errs[0],
                    *s,
                    *a,
                    &|gpu| eager_us(e, gpu),
                    &|gpu| Effs {
                        fp8: pick(c8, &FP8_CANDIDATES, gpu),
                        fp4: pick(c4, &FP4_CANDIDATES, gpu),
                        allreduce: ar,
                    },
                )?;
                errs.push(moved);
            }
            by_ar_eff.push((key.clone(), errs));
        }
        let ar_eff_fit = |key: Key, train: &[usize]| per_gpu(at(&by_ar_eff, key), &gpus, train).0;
        let ar_eff_of: Vec<PerGpu> = (0..folds)
            .map(|f| ar_eff_fit(eager_key(f), &split(f).1))
            .collect();
        let ar_eff_all = ar_eff_fit(eager_key_all.clone(), &idx);
        // TTFT under each front-end cost, at every (step overhead, all-reduce, eager floor,
        // fp8, fp4 and all-reduce efficiency per GPU) a fit chose.
        type FullKey = (Key, PerGpu);
        let key_of = |f: usize| -> FullKey { (eager_key(f), ar_eff_of[f].clone()) };
        let key_all: FullKey = (eager_key_all, ar_eff_all.clone());
        let mut needed: Vec<FullKey> = (0..folds).map(key_of).collect();
        needed.push(key_all.clone());
        needed.sort();
        needed.dedup();
        // A pass over `rows` (the others keeping `base`'s errors) under every term a fit
        // chose (`key`), a front-end cost and a campaign's choice.
        let run_choice = |key: &FullKey,
                          request_ms: f64,
                          choice: CampaignChoice,
                          (rows, base): (&[AggregateRow], &Errors)| {
            let ((s, a, e, c8, c4), ar_choice) = key;
            memo_pass(&memo, rows, &gpu_of, (&index, base), &|gpu| EngineCost {
                unrecorded: choice.setting,
                frontend_update_us: choice.frontend_update_us.or(prior.frontend_update_us),
                ..candidate(
                    STEP_CANDIDATES_US[*s],
                    ALLREDUCE_CANDIDATES_US[*a],
                    choice.eager_layer_us.unwrap_or_else(|| eager_us(e, gpu)),
                    request_ms,
                    Effs {
                        fp8: pick(c8, &FP8_CANDIDATES, gpu),
                        fp4: pick(c4, &FP4_CANDIDATES, gpu),
                        allreduce: pick(ar_choice, &ALLREDUCE_EFF_CANDIDATES, gpu),
                    },
                    prior,
                )
            })
        };
        // Every row under `key`, a front-end cost and a setting.
        let run_whole = |key: &FullKey, request_ms: f64, setting: Unrecorded| {
            let choice = CampaignChoice {
                setting,
                ..CampaignChoice::default()
            };
            run_choice(key, request_ms, choice, (mine_ref, &baseline))
        };
        let mut by_req: Vec<(FullKey, Vec<Errors>)> = Vec::new();
        for key in &needed {
            let ((s, a, e, c8, c4), ar_choice) = key;
            // No front-end cost is the all-reduce stage's pass.
            let ar_effs = at(&by_ar_eff, (*s, *a, e.clone(), c8.clone(), c4.clone()));
            let mut errs = vec![under(ar_effs, ar_choice, &gpus)];
            for &ms in &CANDIDATES_MS[1..] {
                errs.push(run_whole(key, ms, Unrecorded::AsRecorded)?);
            }
            by_req.push((key.clone(), errs));
        }
        let r_of: Vec<usize> = (0..folds)
            .map(|f| best(at(&by_req, key_of(f)), &split(f).1, Score::Ttft))
            .collect();
        let r_all = best(at(&by_req, key_all.clone()), &idx, Score::Ttft);
        // Last, per campaign: every row under each fit's whole cost with each setting (as
        // recorded is the front-end stage's pass); then each campaign's setting and eager
        // floor together, and its front end under them, each chosen on the campaign's own
        // rows of `train` (the sum of the medians, as for the terms) where a k-fold inside
        // those rows says that taking one holds out better than none.
        let (campaigns, campaign) = campaigns_of(&mine, &index, n);
        let campaign_rows: Vec<Vec<AggregateRow>> = (0..campaigns.len())
            .map(|c| {
                mine.iter()
                    .filter(|r| index.get(&r.line).is_some_and(|&i| campaign[i] == c))
                    .cloned()
                    .collect()
            })
            .collect();
        let mut whole: Vec<((FullKey, usize), Vec<Errors>)> = Vec::new();
        let mut wanted: Vec<(FullKey, usize)> = (0..folds).map(|f| (key_of(f), r_of[f])).collect();
        wanted.push((key_all.clone(), r_all));
        wanted.sort();
        wanted.dedup();
        for (key, r) in wanted {
            let mut errs = vec![at(&by_req, key.clone())[r].clone()];
            for &setting in &Unrecorded::ALL[1..] {
                errs.push(run_whole(&key, CANDIDATES_MS[r], setting)?);
            }
            whole.push(((key, r), errs));
        }
        // The candidate of `errs` a campaign's training `rows` take (0: the first).
        let choose = |errs: &[Errors], rows: &[usize]| holds_out(errs, rows).unwrap_or(0);
        // Each campaign's choice on `train` under the fit `(key, r)`, and every row's errors
        // under its campaign's choice.
        let campaign_fit = |key: &FullKey,
                            r: usize,
                            train: &[usize]|
         -> Result<(Vec<CampaignChoice>, Errors), crate::SimError> {
            let settings = at(&whole, (key.clone(), r));
            let mut chosen = Vec::with_capacity(campaigns.len());
            let mut out = settings[0].clone();
            for (c, rows_c) in campaign_rows.iter().enumerate() {
                let rows: Vec<usize> = train
                    .iter()
                    .copied()
                    .filter(|&i| campaign[i] == c)
                    .collect();
                // A campaign of few training rows keeps the fit (a median of a handful of
                // rows picks by noise).
                if rows.len() < MIN_CAMPAIGN_ROWS {
                    chosen.push(CampaignChoice::default());
                    continue;
                }
                // The setting and the campaign's floor together (a setting can move the
                // floor that suits the rows): each setting at the fit's floors (the passes
                // over every row), then at each floor on every GPU (a pass over the
                // campaign's rows); then its front end under both.
                let mut choices: Vec<CampaignChoice> = Unrecorded::ALL
                    .iter()
                    .map(|&setting| CampaignChoice {
                        setting,
                        ..CampaignChoice::default()
                    })
                    .collect();
                let mut errs: Vec<Errors> = settings.to_vec();
                for (k, &setting) in Unrecorded::ALL.iter().enumerate() {
                    for &us in &EAGER_CANDIDATES_US {
                        let choice = CampaignChoice {
                            setting,
                            eager_layer_us: Some(us),
                            ..CampaignChoice::default()
                        };
                        errs.push(run_choice(
                            key,
                            CANDIDATES_MS[r],
                            choice,
                            (rows_c, &settings[k]),
                        )?);
                        choices.push(choice);
                    }
                }
                let j = choose(&errs, &rows);
                let mut choice = choices[j];
                let mut current = errs.swap_remove(j);
                let mut cands = vec![current.clone()];
                for &us in &FRONTEND_CANDIDATES_US {
                    let ch = CampaignChoice {
                        frontend_update_us: Some(us),
                        ..choice
                    };
                    cands.push(run_choice(key, CANDIDATES_MS[r], ch, (rows_c, &current))?);
                }
                let j = choose(&cands, &rows);
                if j > 0 {
                    choice.frontend_update_us = Some(FRONTEND_CANDIDATES_US[j - 1]);
                    current = cands.swap_remove(j);
                }
                for i in (0..n).filter(|&i| campaign[i] == c) {
                    out[i] = current[i];
                }
                chosen.push(choice);
            }
            Ok((chosen, out))
        };
        let named = |chosen: &[CampaignChoice]| -> Vec<(String, CampaignChoice)> {
            chosen
                .iter()
                .enumerate()
                .filter(|&(_, ch)| *ch != CampaignChoice::default())
                .map(|(c, ch)| (campaigns[c].clone(), *ch))
                .collect()
        };
        let mut held_out_ttft = Vec::new();
        let mut held_out_tpot = Vec::new();
        let mut held_out_rows = Vec::new();
        let mut fold_fits = Vec::new();
        for f in 0..folds {
            let (test, train) = split(f);
            let (chosen, errs) = campaign_fit(&key_of(f), r_of[f], &train)?;
            let (eager_layer_us, eager) = shared_eager(&eager_of[f].0);
            fold_fits.push(FoldFit {
                step_overhead_us: STEP_CANDIDATES_US[step_of[f]],
                allreduce_latency_us: ALLREDUCE_CANDIDATES_US[ar_of[f]],
                eager_layer_us,
                request_overhead_ms: CANDIDATES_MS[r_of[f]],
                by_gpu: ByGpu {
                    eager,
                    ..ByGpu::of(&eager_of[f].1, &eager_of[f].2, &ar_eff_of[f])
                },
                unrecorded: named(&chosen),
            });
            for &i in &test {
                held_out_ttft.push(errs[i].0);
                held_out_tpot.push(errs[i].1);
                held_out_rows.push((i, f));
            }
        }
        let unrecorded = named(&campaign_fit(&key_all, r_all, &idx)?.0);
        let (eager_layer_us, eager) = shared_eager(&eager_all.0);
        fits.push(EngineFit {
            engine,
            rows: n,
            request_overhead_ms: CANDIDATES_MS[r_all],
            step_overhead_us: STEP_CANDIDATES_US[step_all],
            allreduce_latency_us: ALLREDUCE_CANDIDATES_US[ar_all],
            eager_layer_us,
            by_gpu: ByGpu {
                eager,
                ..ByGpu::of(&eager_all.1, &eager_all.2, &ar_eff_all)
            },
            unrecorded,
            fold_fits,
            held_out_ttft,
            held_out_tpot,
            ids,
            gpus,
            held_out_rows,
            passes: {
                let m = memo.borrow();
                (m.simulated, m.reused)
            },
            baseline_ttft: baseline.iter().map(|e| e.0).collect(),
            baseline_tpot: baseline.iter().map(|e| e.1).collect(),
        });
    }
    Ok(fits)
}

/// The fewest training rows of a campaign on which its [`CampaignChoice`] is made: a
/// smaller campaign keeps the fit (a median of a handful of rows picks by noise).
pub const MIN_CAMPAIGN_ROWS: usize = 8;

/// Parts of the k-fold inside a campaign's training rows that decides whether it takes a
/// choice at all ([`holds_out`]).
pub const INNER_FOLDS: usize = 4;

/// Parts of that k-fold whose own choice must be the one all of a campaign's training rows
/// make ([`holds_out`]): a choice that flips with which quarter of the rows is left out
/// fits noise, even where the flips hold out on average.
pub const INNER_AGREE: usize = 3;

/// Whether choosing a setting on part of a campaign's `rows` beats keeping them as
/// recorded on the rest: over [`INNER_FOLDS`] parts, each part's errors under the setting
/// (`errs[k]`, `errs[0]` as recorded) the other parts choose, scored as the stages score
/// (the sum of the TTFT and TPOT medians of |error|), against the same rows as recorded.
/// A setting that fits a campaign's training rows by chance (the best of several
/// candidates on a few dozen rows always fits them a little better) then stays out, and so
/// does one that [`INNER_AGREE`] of the parts do not choose themselves. Returns the choice
/// all of `rows` make where it holds out.
fn holds_out(errs: &[Errors], rows: &[usize]) -> Option<usize> {
    let mut chosen: Errors = Vec::new();
    let mut kept: Errors = Vec::new();
    let mut ks = Vec::new();
    for j in 0..INNER_FOLDS {
        let train: Vec<usize> = (0..rows.len())
            .filter(|p| p % INNER_FOLDS != j)
            .map(|p| rows[p])
            .collect();
        let k = best(errs, &train, Score::BOTH);
        ks.push(k);
        for p in (j..rows.len()).step_by(INNER_FOLDS) {
            chosen.push(errs[k][rows[p]]);
            kept.push(errs[0][rows[p]]);
        }
    }
    let score = |e: &Errors| {
        let (t, p): (Vec<f64>, Vec<f64>) = e.iter().copied().unzip();
        median_abs(&t) + median_abs(&p)
    };
    let all = best(errs, rows, Score::BOTH);
    (score(&chosen) < score(&kept) && ks.iter().filter(|&&k| k == all).count() >= INNER_AGREE)
        .then_some(all)
}

/// A row's campaign: its engine version (or `unversioned`), model and system, which one
/// harness measured together in one sweep (`1.0.0rc3 meta-llama/Llama-3.1-8B-Instruct
/// h100_sxm`).
pub fn campaign_of(row: &AggregateRow) -> String {
    let version = if row.backend_version.is_empty() {
        "unversioned"
    } else {
        &row.backend_version
    };
    format!("{version} {} {}", row.model, row.system)
}

/// The campaigns of `rows` (sorted) and each simulated row's campaign, by row index
/// (`index`: row line to index; `n` rows).
fn campaigns_of(
    rows: &[AggregateRow],
    index: &HashMap<u64, usize>,
    n: usize,
) -> (Vec<String>, Vec<usize>) {
    let mut names: Vec<String> = rows.iter().map(campaign_of).collect();
    names.sort();
    names.dedup();
    let mut of = vec![0; n];
    for r in rows {
        if let Some(&i) = index.get(&r.line) {
            of[i] = names.binary_search(&campaign_of(r)).unwrap_or(0);
        }
    }
    (names, of)
}

/// ` / held-slot, eager floor 600 us: 1.0.0rc3 meta-llama/Llama-3.1-8B-Instruct
/// h100_sxm` (empty for none).
fn describe_unrecorded(list: &[(String, CampaignChoice)]) -> String {
    list.iter()
        .map(|(c, u)| format!(" / {}: {c}", u.describe()))
        .collect()
}

/// One eager floor's errors under each fp8 efficiency ([`FP8_CANDIDATES`], the first the
/// default) and each fp4 efficiency ([`FP4_CANDIDATES`], the first the same default pass):
/// the fp8 candidates move only rows with fp8 weights, the fp4 ones only rows with fp4
/// weights, so a GPU's two choices are made apart and combine row by row.
struct LowPrecision {
    fp8s: Vec<Errors>,
    fp4s: Vec<Errors>,
}

impl LowPrecision {
    /// Each GPU's fp8 and fp4 candidates chosen on `train` ([`per_gpu`]), and every row's
    /// errors under both.
    fn fit(&self, gpus: &[&'static str], train: &[usize]) -> (PerGpu, PerGpu, Errors) {
        let c8 = per_gpu(&self.fp8s, gpus, train).0;
        let c4 = per_gpu(&self.fp4s, gpus, train).0;
        let errors = self.under(&c8, &c4, gpus);
        (c8, c4, errors)
    }

    /// Every row's errors under the per-GPU fp8 choice `c8` and fp4 choice `c4`: a row the
    /// fp4 choice moved from the default pass takes its fp4 errors, every other row its fp8
    /// ones (the default pass where neither moves it).
    fn under(
        &self,
        c8: &[(&'static str, usize)],
        c4: &[(&'static str, usize)],
        gpus: &[&'static str],
    ) -> Errors {
        let e8 = under(&self.fp8s, c8, gpus);
        let e4 = under(&self.fp4s, c4, gpus);
        (0..gpus.len())
            .map(|i| {
                if e4[i] != self.fp4s[0][i] {
                    e4[i]
                } else {
                    e8[i]
                }
            })
            .collect()
    }
}

/// The calibration file of one engine's fit.
pub fn fit_toml(fit: &EngineFit, source: &str, folds: usize) -> String {
    let framework = framework_name(&fit.engine);
    let folds_text: Vec<String> = fit.fold_fits.iter().map(FoldFit::describe).collect();
    // The header's line break sits before the last key, as the shipped files have it.
    let engine_keys = silicon::engine_keys(&fit.engine).replacen(
        ", max_num_batched_tokens",
        ",\n# max_num_batched_tokens",
        1,
    );
    let edge = if fit.request_overhead_ms >= CANDIDATES_MS[CANDIDATES_MS.len() - 1] {
        "\n# The front-end cost is the largest tried: a constant does not explain these rows."
    } else {
        ""
    };
    let held = held_out_figures(
        (&fit.held_out_ttft, &fit.held_out_tpot),
        (&fit.baseline_ttft, &fit.baseline_tpot),
    )
    .quote("defaults", ["\n# ", " "]);
    // Settings of the measured runs, not of a deployment: comments, which no scenario reads.
    let unrecorded: String = fit
        .unrecorded
        .iter()
        .map(|(c, u)| {
            format!(
                "\n# Campaign {c} simulated with {} (its rows do not record it).",
                u.describe()
            )
        })
        .collect();
    // The same header either way; a fit that lost to the defaults says so, and its
    // `[cost]` names only the framework.
    let (verdict, kept, cost) = if fit.kept_defaults() {
        (
            ", lost to the defaults held out",
            "\n# So this file keeps the defaults: [cost] names only the framework, and [fit] and the .rows.csv beside it hold\n\
             # the defaults' errors on these rows (not held out of the kernels' fits, which saw them too).",
            String::new(),
        )
    } else {
        (
            "",
            "",
            format!(
                "step_overhead_us = {us:.1}\n{ar}eager_layer_us = {eager:.1}\nrequest_overhead_ms = {ms:.1}\n{fp8}",
                ar = fit
                    .allreduce_latency_us
                    .map_or(String::new(), |a| format!("allreduce_latency_us = {a:.1}\n")),
                fp8 = fit.by_gpu.toml_tables(),
                us = fit.step_overhead_us,
                eager = fit.eager_layer_us,
                ms = fit.request_overhead_ms,
            ),
        )
    };
    format!(
        "# {engine}: the step overhead, tensor-parallel all-reduce latency, eager step floor, fp8, fp4 and all-reduce efficiencies per GPU and per-request front-end cost\n\
         # fitted by `sim calibrate --observed {source}` to {rows} measured closed-loop deployments of {engine}\n\
         # (aiconfigurator silicon.csv), one term at a time{verdict}. {folds}-fold held-out: {held}; the folds' fits: {ff}.{edge}{kept}{unrecorded}\n\
         # Fitted under the engine's serving defaults (`sim validate-model`): [engine] {engine_keys}.\n\
         [cost]\nframework = \"{framework}\"\n{cost}",
        engine = fit.engine,
        rows = fit.rows,
        ff = folds_text.join(", "),
    ) + &fit_section(fit, source, folds)
}

/// Every row's held-out errors under its fold's fit, with the defaults' beside them, as
/// CSV (`id,fold,ttft_error,tpot_error,default_ttft_error,default_tpot_error`; signed
/// relative errors, in the rows' order), so a user sees which of the engine's deployments
/// the fit misses.
///
/// A fit that kept the defaults ([`EngineFit::kept_defaults`]) lists the defaults' errors in
/// both pairs of columns: what its file gives.
pub fn fit_rows_csv(fit: &EngineFit) -> Result<String, crate::SimError> {
    let (ttft, tpot) = shipped_errors(fit);
    held_out_csv(
        &format!("observed-{}.rows.csv", fit.engine),
        &fit.ids,
        &fit.held_out_rows,
        (&ttft, &tpot),
        (&fit.baseline_ttft, &fit.baseline_tpot),
    )
}

/// The `(TTFT, TPOT)` errors of the file a fit ships, in the order of `held_out_rows`: the
/// held-out errors, or the defaults' where it kept them.
fn shipped_errors(fit: &EngineFit) -> (Vec<f64>, Vec<f64>) {
    if fit.kept_defaults() {
        fit.held_out_rows
            .iter()
            .map(|&(i, _)| (fit.baseline_ttft[i], fit.baseline_tpot[i]))
            .unzip()
    } else {
        (fit.held_out_ttft.clone(), fit.held_out_tpot.clone())
    }
}

/// Rows' held-out errors as CSV (`id,fold,ttft_error,tpot_error,default_ttft_error,
/// default_tpot_error`), sorted by row: `rows[k] = (row index, fold)` of the `k`-th held-out
/// `(TTFT, TPOT)` error, `baseline` by row index; `name` names the file in errors.
pub(super) fn held_out_csv(
    name: &str,
    ids: &[String],
    rows: &[(usize, usize)],
    (ttft, tpot): (&[f64], &[f64]),
    (base_ttft, base_tpot): (&[f64], &[f64]),
) -> Result<String, crate::SimError> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let io = |e: String| crate::SimError::Io {
        path: name.to_string(),
        source: std::io::Error::other(e),
    };
    w.write_record([
        "id",
        "fold",
        "ttft_error",
        "tpot_error",
        "default_ttft_error",
        "default_tpot_error",
    ])
    .map_err(|e| io(e.to_string()))?;
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by_key(|&k| rows[k].0);
    for k in order {
        let (i, fold) = rows[k];
        w.write_record([
            ids[i].clone(),
            fold.to_string(),
            format!("{:.4}", ttft[k]),
            format!("{:.4}", tpot[k]),
            format!("{:.4}", base_ttft[i]),
            format!("{:.4}", base_tpot[i]),
        ])
        .map_err(|e| io(e.to_string()))?;
    }
    let bytes = w.into_inner().map_err(|e| io(e.to_string()))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The `[fit]` table: each fold's fit and the held-out error intervals, from which `sim
/// run` and `sim plan` draw their bands
/// ([`FitRecord`](super::uncertainty::FitRecord)).
///
/// A fit that kept the defaults records no fold's fit (none is shipped) and the defaults'
/// error intervals.
fn fit_section(fit: &EngineFit, source: &str, folds: usize) -> String {
    let (folds_list, kept): (Vec<String>, &str) = if fit.kept_defaults() {
        (
            Vec::new(),
            " (lost to the defaults held out: the defaults kept)",
        )
    } else {
        (
            fit.fold_fits.iter().map(FoldFit::inline_table).collect(),
            "",
        )
    };
    let (ttft, tpot) = shipped_errors(fit);
    fit_record_toml(
        &format!(
            "sim calibrate --observed {source}: step overhead, all-reduce latency, eager step floor, fp8, fp4 and all-reduce efficiencies per GPU and front-end cost of {}, {folds}-fold on {} rows{kept}",
            fit.engine, fit.rows
        ),
        &folds_list,
        &ttft,
        &tpot,
    )
}

/// A `[fit]` table: what was fitted (`what`), each fold's `[cost]` keys as an inline table,
/// and the held-out signed errors' central 50% and 90% intervals.
pub(super) fn fit_record_toml(what: &str, folds: &[String], ttft: &[f64], tpot: &[f64]) -> String {
    let interval = |v: &[f64], lo: f64, hi: f64| {
        format!(
            "[{:.4}, {:.4}]",
            analysis::percentile(v, lo),
            analysis::percentile(v, hi)
        )
    };
    let folds_list: Vec<String> = folds.iter().map(|f| format!("  {f},")).collect();
    format!(
        "\n# Each fold's fit, and the held-out signed error's central 50% and 90% intervals.\n\
         [fit]\nsource = {}\nfolds = [\n{}\n]\n\
         ttft_error_50 = {}\nttft_error_90 = {}\ntpot_error_50 = {}\ntpot_error_90 = {}\n",
        toml::Value::String(what.to_string()),
        folds_list.join("\n"),
        interval(ttft, 25.0, 75.0),
        interval(ttft, 5.0, 95.0),
        interval(tpot, 25.0, 75.0),
        interval(tpot, 5.0, 95.0),
    )
}

/// The `[cost] framework` name of an engine's serving framework.
pub(super) fn framework_name(engine: &str) -> String {
    toml::Value::try_from(silicon::engine_framework(engine))
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The fits as a table (held-out errors in percent).
pub fn fit_table(fits: &[EngineFit]) -> String {
    let mut s = String::from(
        "engine   rows  step us  all-reduce us  eager us/layer  front ms  efficiencies by GPU                                TTFT |err| held out p50 / p90 (defaults p50)   TPOT |err| held out p50 / p90 (defaults p50)\n",
    );
    for f in fits {
        let h = held_out_figures(
            (&f.held_out_ttft, &f.held_out_tpot),
            (&f.baseline_ttft, &f.baseline_tpot),
        );
        s.push_str(&format!(
            "{:<8} {:>4} {:>8.0} {:>14} {:>15.0} {:>9.0}  {:<50} {:>8.1}% / {:>6.1}% ({:>5.1}%)                {:>8.1}% / {:>6.1}% ({:>5.1}%)\n",
            f.engine,
            f.rows,
            f.step_overhead_us,
            f.allreduce_latency_us
                .map_or("default".to_string(), |a| format!("{a:.0}")),
            f.eager_layer_us,
            f.request_overhead_ms,
            f.by_gpu.describe(),
            h.t,
            h.t90,
            h.bt,
            h.p,
            h.p90,
            h.bp,
        ));
        if f.kept_defaults() {
            s.push_str(&format!(
                "{:<8} lost to the defaults held out: its file keeps the defaults\n",
                f.engine
            ));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::{
        all_reduces, candidate, fit_rows_csv, fit_toml, has_fp4_weights, has_fp8_weights,
        holds_out, loses_to_defaults, pass, pass_moving, pass_with_lines, per_gpu, ByGpu,
        CampaignChoice, Effs, EngineFit, FoldFit, LowPrecision, ALLREDUCE_EFF_CANDIDATES,
        FP4_CANDIDATES, FP8_CANDIDATES,
    };
    use crate::cost_model::validation::silicon::{EngineCost, Unrecorded};

    /// A campaign takes a choice only where the k-fold inside its training rows says the
    /// choice holds out: one better on every row does; one far better on a quarter of the
    /// rows and worse on the rest does not, nor one that only ties.
    #[test]
    fn a_campaign_takes_a_choice_only_where_it_holds_out() {
        let rows: Vec<usize> = (0..16).collect();
        let kept: Vec<(f64, f64)> = vec![(0.3, 0.05); 16];
        let better: Vec<(f64, f64)> = vec![(0.1, 0.05); 16];
        assert_eq!(holds_out(&[kept.clone(), better], &rows), Some(1));
        let lucky: Vec<(f64, f64)> = (0..16)
            .map(|p| if p % 4 == 0 { (0.0, 0.0) } else { (0.6, 0.05) })
            .collect();
        assert_eq!(holds_out(&[kept.clone(), lucky], &rows), None);
        assert_eq!(holds_out(&[kept.clone(), kept.clone()], &rows), None);
        // Two candidates, each far better on half the rows: the parts' choices flip
        // between them, so neither is taken even though each part's pick holds out.
        let halves = |odd: bool| -> Vec<(f64, f64)> {
            (0..16)
                .map(|p| {
                    if (p / 2) % 2 == usize::from(odd) {
                        (0.0, 0.05)
                    } else {
                        (0.29, 0.05)
                    }
                })
                .collect()
        };
        assert_eq!(holds_out(&[kept, halves(false), halves(true)], &rows), None);
        let choice = CampaignChoice {
            setting: Unrecorded::OnePrompt,
            eager_layer_us: Some(600.0),
            frontend_update_us: Some(80.0),
        };
        assert_eq!(
            choice.describe(),
            "one-prompt, eager floor 600 us, front end 80 us an update"
        );
        assert_eq!(CampaignChoice::default().describe(), "as-recorded");
    }

    /// A fit that does not beat the defaults held out (the sum of its TTFT and TPOT median
    /// |error| is not below theirs) ships the defaults: a `[cost]` of the framework alone, a
    /// `[fit]` with no fold's fit and the defaults' error intervals, and the defaults' errors
    /// in its rows file; one that beats them ships its terms.
    #[test]
    fn a_fit_that_loses_to_the_defaults_held_out_ships_them() {
        let fold = FoldFit {
            step_overhead_us: 300.0,
            allreduce_latency_us: None,
            eager_layer_us: 900.0,
            request_overhead_ms: 80.0,
            by_gpu: ByGpu::default(),
            unrecorded: Vec::new(),
        };
        let mut fit = EngineFit {
            engine: "sglang".into(),
            rows: 4,
            request_overhead_ms: 80.0,
            step_overhead_us: 300.0,
            allreduce_latency_us: None,
            eager_layer_us: 900.0,
            by_gpu: ByGpu::default(),
            unrecorded: Vec::new(),
            fold_fits: vec![fold.clone(), fold],
            // Held out TTFT 0.15 and TPOT 0.05 median |err| against the defaults' 0.10 and 0.04.
            held_out_ttft: vec![0.1, -0.2, 0.15, -0.15],
            held_out_tpot: vec![0.05, -0.05, 0.05, -0.05],
            baseline_ttft: vec![-0.1, 0.1, -0.1, 0.1],
            baseline_tpot: vec![0.04, 0.04, -0.04, -0.04],
            ids: (0..4).map(|i| format!("row{i}")).collect(),
            gpus: vec!["h200"; 4],
            held_out_rows: vec![(0, 0), (1, 1), (2, 0), (3, 1)],
            passes: (0, 0),
        };
        assert!(fit.kept_defaults());
        let text = fit_toml(&fit, "silicon.csv", 2);
        let parsed: toml::Table = toml::from_str(&text).expect("valid TOML");
        let cost = parsed["cost"].as_table().expect("[cost]");
        assert_eq!(cost.keys().collect::<Vec<_>>(), ["framework"], "{text}");
        assert!(text.contains("lost to the defaults held out"), "{text}");
        let record =
            crate::cost_model::calibration::uncertainty::FitRecord::from_file_table(&parsed)
                .expect("valid [fit]")
                .expect("[fit] present");
        assert!(record.folds.is_empty());
        // The defaults' TTFT errors lie in [-0.1, 0.1], the fit's spread wider.
        assert!(record.ttft_error_90[0] >= -0.1 && record.ttft_error_90[1] <= 0.1);
        let csv = fit_rows_csv(&fit).expect("rows csv");
        for line in csv.lines().skip(1) {
            let cols: Vec<&str> = line.split(',').collect();
            assert_eq!(cols[2..4], cols[4..6], "{csv}");
        }
        // Swap the two: the fit now wins and ships its terms and folds.
        std::mem::swap(&mut fit.held_out_ttft, &mut fit.baseline_ttft);
        std::mem::swap(&mut fit.held_out_tpot, &mut fit.baseline_tpot);
        assert!(!fit.kept_defaults());
        let text = fit_toml(&fit, "silicon.csv", 2);
        assert!(text.contains("\nstep_overhead_us = 300.0\n"), "{text}");
        assert!(!text.contains("lost to the defaults"), "{text}");
        let parsed: toml::Table = toml::from_str(&text).expect("valid TOML");
        let record =
            crate::cost_model::calibration::uncertainty::FitRecord::from_file_table(&parsed)
                .expect("valid [fit]")
                .expect("[fit] present");
        assert_eq!(record.folds.len(), 2);
        // A tie keeps the defaults: a fit must earn its file.
        let same = [0.1, -0.1];
        assert!(loses_to_defaults((&same, &same), (&same, &same)));
    }

    /// Simulating only the rows a candidate moves gives every row the errors a full pass
    /// gives: rows with 16-bit or fp4 weights do not feel an fp8 efficiency, rows without fp4
    /// weights an fp4 one, nor rows at TP 1 an all-reduce's latency or efficiency.
    #[test]
    fn the_rows_a_candidate_cannot_move_keep_their_errors() {
        let mut rows = crate::observed::silicon::read(std::path::Path::new(
            "tests/data/observed/silicon-small.csv",
        ))
        .expect("rows");
        // A third of the rows in 16 bits and a third in NVFP4, half of those on a B200 and
        // half left on their Hopper (which has no fp4 tensor cores: its fp4 rows do not feel
        // the fp4 efficiency), at TP 1, 2 and 4 alike.
        for (i, r) in rows.iter_mut().enumerate() {
            match i % 3 {
                0 => r.gemm_quant.clear(),
                1 => {
                    r.gemm_quant = "nvfp4".into();
                    if i % 2 == 1 {
                        r.system = "b200_sxm".into();
                    }
                }
                _ => {}
            }
        }
        assert!(rows
            .iter()
            .any(|r| has_fp4_weights(r) && r.system != "b200_sxm"));
        assert!(rows.iter().any(|r| !has_fp8_weights(r) && all_reduces(r)));
        assert!(rows.iter().any(|r| has_fp8_weights(r) && !all_reduces(r)));
        assert!(rows.iter().any(has_fp4_weights));
        let shared = EngineCost::default();
        let base = |_: &str| candidate(300.0, None, 600.0, 0.0, Effs::default(), &shared);
        let (_, _, first, index) = pass_with_lines(&rows, &base).expect("pass");
        type Moves<'a> = &'a dyn Fn(&crate::observed::silicon::AggregateRow) -> bool;
        let effs = |fp8, fp4, allreduce| Effs {
            fp8,
            fp4,
            allreduce,
        };
        let moved: [(Moves, _); 4] = [
            (&has_fp8_weights, (None, effs(Some(0.5), None, None))),
            (&has_fp4_weights, (None, effs(None, Some(0.8), None))),
            (&all_reduces, (Some(40.0), Effs::default())),
            (&all_reduces, (None, effs(None, None, Some(0.3)))),
        ];
        for (moves, (latency, effs)) in moved {
            let cost = |_: &str| candidate(300.0, latency, 600.0, 0.0, effs, &shared);
            let full = pass(&rows, &cost).expect("full pass");
            let spliced = pass_moving(&rows, moves, (&index, &first), &cost).expect("pass");
            assert_eq!(spliced, full, "{latency:?} {effs:?}");
            assert_ne!(
                full, first,
                "the candidate moves some row: {latency:?} {effs:?}"
            );
        }
    }

    #[test]
    fn each_gpu_takes_the_efficiency_its_own_moved_rows_favour() {
        // Rows 0-1 on a B200 are best under candidate 1, rows 2-3 on an H200 under
        // candidate 2; row 4 (16-bit weights, the same under every candidate) is left out
        // of the H200's choice, which it would otherwise not change anyway.
        let gpus = ["b200", "b200", "h200", "h200", "h200"];
        let by_fp8: Vec<Vec<(f64, f64)>> = (0..FP8_CANDIDATES.len())
            .map(|c| {
                let b = if c == 1 { 0.01 } else { 0.3 };
                let h = if c == 2 { 0.02 } else { 0.4 };
                vec![(b, b), (-b, b), (h, -h), (h, h), (0.05, 0.05)]
            })
            .collect();
        let train = [0, 1, 2, 3, 4];
        let (choice, errors) = per_gpu(&by_fp8, &gpus, &train);
        assert_eq!(choice, vec![("b200", 1), ("h200", 2)]);
        assert_eq!(errors[0], (0.01, 0.01));
        assert_eq!(errors[2], (0.02, -0.02));
        assert_eq!(errors[4], (0.05, 0.05));
        // With an all-reduce efficiency on the B200 only, the two share its table.
        let written = ByGpu::of(&choice, &[], &[("b200", 3), ("h200", 0)]);
        let (f1, f2, a3) = (
            FP8_CANDIDATES[1].unwrap_or_default(),
            FP8_CANDIDATES[2].unwrap_or_default(),
            ALLREDUCE_EFF_CANDIDATES[3].unwrap_or_default(),
        );
        assert_eq!(written.fp8, vec![("b200", f1), ("h200", f2)]);
        assert_eq!(written.allreduce, vec![("b200", a3)]);
        let tables = written.toml_tables();
        assert_eq!(tables.matches("[cost.by_gpu.b200]").count(), 1, "{tables}");
        let parsed: toml::Table = toml::from_str(&tables).expect("TOML");
        let b200 = &parsed["cost"]["by_gpu"]["b200"];
        assert_eq!(b200["allreduce_eff"].as_float(), Some(a3));
        assert_eq!(b200["fp8_compute_eff"].as_float(), Some(f1));
        let inline: toml::Table =
            toml::from_str(&format!("x = {}", written.inline())).expect("inline TOML");
        assert_eq!(inline["x"]["h200"]["fp8_compute_eff"].as_float(), Some(f2));
        // A GPU none of whose training rows the candidates move keeps the default.
        let (choice, _) = per_gpu(&by_fp8, &gpus, &[4]);
        assert_eq!(choice, vec![("b200", 0), ("h200", 0)]);
        assert!(ByGpu::of(&choice, &[], &[]).is_empty());
    }

    /// A GPU's fp8 and fp4 efficiencies are chosen apart, each on the rows it moves, and
    /// combine row by row: an fp8 row takes the fp8 choice's errors, an fp4 row the fp4
    /// choice's, a 16-bit row the default pass's; both land in the GPU's table.
    #[test]
    fn fp8_and_fp4_rows_take_their_own_efficiencies() {
        // Row 0 has fp8 weights (best under fp8 candidate 2), row 1 fp4 weights (best under
        // fp4 candidate 3), row 2 16-bit weights (the same under every candidate).
        let gpus = ["b200"; 3];
        let default = [(0.3, 0.3), (0.4, 0.4), (0.05, 0.05)];
        let fp8s: Vec<Vec<(f64, f64)>> = (0..FP8_CANDIDATES.len())
            .map(|c| {
                let e = if c == 2 { 0.01 } else { 0.3 };
                vec![(e, e), default[1], default[2]]
            })
            .collect();
        let fp4s: Vec<Vec<(f64, f64)>> = (0..FP4_CANDIDATES.len())
            .map(|c| {
                let e = if c == 3 { 0.02 } else { 0.4 };
                vec![default[0], (e, -e), default[2]]
            })
            .collect();
        let lp = LowPrecision { fp8s, fp4s };
        let (c8, c4, errors) = lp.fit(&gpus, &[0, 1, 2]);
        assert_eq!((c8, c4.clone()), (vec![("b200", 2)], vec![("b200", 3)]));
        assert_eq!(errors, vec![(0.01, 0.01), (0.02, -0.02), (0.05, 0.05)]);
        // The fp4 choice alone leaves the fp8 row at the default pass.
        assert_eq!(lp.under(&[], &c4, &gpus)[0], default[0]);
        let written = ByGpu::of(&[("b200", 2)], &c4, &[]);
        assert_eq!(
            written.fp4,
            vec![("b200", FP4_CANDIDATES[3].unwrap_or_default())]
        );
        let parsed: toml::Table = toml::from_str(&written.toml_tables()).expect("TOML");
        let b200 = &parsed["cost"]["by_gpu"]["b200"];
        assert_eq!(b200["fp4_compute_eff"].as_float(), FP4_CANDIDATES[3]);
        assert_eq!(b200["fp8_compute_eff"].as_float(), FP8_CANDIDATES[2]);
        assert!(
            written.describe().contains("fp4 b200 0.60"),
            "{}",
            written.describe()
        );
    }
}
