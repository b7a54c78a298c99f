//! Each engine's own mixture-of-experts kernels (part of `sim calibrate --observed`, stage
//! `moe-engines`): the grouped-GEMM efficiency it reaches on each GPU for each expert
//! format and experts' shape (`[cost.by_gpu.<gpu>] moe_gemm_eff`, or
//! `[cost.by_gpu.<gpu>.experts.<format>]` where its fp8 and fp4 experts' kernels part, or
//! `[cost.by_gpu.<gpu>.experts.<format>.shapes.<hidden>x<intermediate>]` where a format's
//! kernels part by the experts' GEMM shape), its fixed cost per expert and MoE layer of
//! a step that prefills there (`moe_prefill_expert_us`) and the efficiency of the grouped
//! GEMMs' compute side where it departs (`moe_compute_eff`), fitted per engine to its
//! mixture-of-experts rows with the shared MoE terms (`moe-*.toml`, the defaults) in place.
//!
//! The shared terms are one value each over every engine's rows, but the engines run
//! different expert kernels: vLLM's block-fp8 Triton MoE on Hoppers streams Qwen3-235B's
//! experts at a fraction of what TensorRT-LLM's do, vLLM's Marlin MXFP4 MoE streams gpt-oss
//! faster than the shared fit prices it but dequantises on the Hoppers' tensor cores, so its
//! prefills are slower than its decodes say, and the per-expert work of a prefill's grouped
//! GEMMs (tile scheduling, scales, launches outside the CUDA graphs) differs from kernel
//! to kernel. Per engine, every MoE row is simulated under each candidate triple it can
//! feel (one triple applies to every GPU in a pass; a row feels only its own GPU's,
//! format's and shape's, so the choices per group come from the same passes; a quarter of a
//! dense GEMM's compute is tried only where the kernel dequantises); per fold each GPU,
//! expert format and shape takes the triple with the smallest weighted sum of the median
//! absolute TTFT and TPOT errors on its rows of the other folds (the TTFT's weight chosen
//! by [`nested_weight`], a k-fold inside the fold's training rows judged by the larger of
//! the two medians), and the held-out fold's errors under those choices are kept. The
//! shapes part the groups because a grouped-GEMM kernel's tiles, and the fraction of the
//! peaks it reaches, follow the experts' dimensions: SGLang's fp8 experts on a B200 stream
//! DeepSeek's 7168x2048 experts at one efficiency and Qwen3.5's 4096x1024 at another
//! (per GPU and format alone: 15.6% held-out TTFT, 433 rows within 15%; with the shapes and
//! the weight: 14.4%, 456; BENCHMARKS, stop 63). Whether a format the tensor cores take (fp8 on a Hopper, fp4 on a
//! Blackwell) is offered a compute side at all is decided per fold and per group (GPU,
//! format and shape: the kernel's question) by a k-fold inside that group's training rows of the fold
//! ([`nested_offer`]): offered everywhere, the choice per group fits TensorRT-LLM's loaded
//! prefills better and SGLang's and vLLM's worse (branch `moe-compute-every-format`,
//! BENCHMARKS), and that is for held-out error to say, not for the training rows, on which
//! the larger offer never loses within a group (decided per engine instead, stop 61, it held
//! out 4 fewer rows within 15% on TTFT; BENCHMARKS, stop 62); that choice is judged by the
//! plain sum of the two medians, as it was made before the weight (the weight is then
//! chosen under the offer). A GPU whose formats and shapes all chose the same triple
//! without a compute side is written as the GPU's terms (a format or shape the rows lack
//! there takes them too); otherwise a format whose shapes all chose the same triple is
//! written as the format's terms (a shape the rows lack takes them too), and a format whose
//! shapes parted per shape, with no terms for the format as a whole: a shape the rows lack
//! there takes the GPU's own terms if it has any, else the shared ones.
//!
//! In: aiconfigurator's rows; out: a [`MoeEngineFit`] per engine, written as
//! `observed-moe-<engine>.toml` (a scenario's `cost.calibration` for a mixture of experts
//! served by that engine, with a `[fit]` table for `sim run`'s bands) and its rows' held-out
//! errors (`observed-moe-<engine>.rows.csv`).

use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::observed::{
    fit_record_toml, framework_name, held_out_csv, held_out_figures, median_abs, pass_moving,
    pass_with_lines, per_gpu_weighted, Errors, LinedPass,
};
use crate::cost_model::validation::silicon::{self, EngineCost};
use crate::cost_model::{ExpertFormat, ExpertShape};
use crate::observed::silicon::AggregateRow;

/// The grouped-GEMM efficiencies tried on each group (GPU, expert format and shape; `None`: the shared
/// fit's, the prior's).
pub const GEMM_CANDIDATES: [Option<f64>; 5] = [None, Some(0.3), Some(0.45), Some(0.8), Some(1.0)];

/// The prefill floors per expert and MoE layer tried on each group,
/// microseconds (`None`: the shared fit's).
pub const PREFILL_CANDIDATES: [Option<f64>; 4] = [None, Some(4.0), Some(12.0), Some(18.0)];

/// The efficiencies of the grouped GEMMs' compute side alone tried on each group
/// (`None`: the grouped-GEMM efficiency, one on both sides): a kernel can stream the
/// experts' weights as fast as another and compute a large prefill at a fraction of the
/// rate, above all one that unpacks them tile by tile (MXFP4 experts on a Hopper, which has
/// no FP4 tensor cores). The last, a quarter, is tried only where the kernel dequantises
/// ([`DEQUANTISING_ONLY`]).
pub const COMPUTE_CANDIDATES: [Option<f64>; 3] = [None, Some(0.5), Some(0.25)];

/// Which of [`COMPUTE_CANDIDATES`] only a group whose kernel dequantises the
/// experts' weights is offered: a quarter of a dense GEMM's compute is a dequantising
/// kernel's (vLLM's Marlin MXFP4 MoE on a Hopper chose it on every fold), and not trying it
/// elsewhere spares a pass of every other row per pair.
const DEQUANTISING_ONLY: [bool; COMPUTE_CANDIDATES.len()] = [false, false, true];
// The first (no compute side) is every row's: the dequantising-only candidates splice onto
// its passes.
const _: () = assert!(!DEQUANTISING_ONLY[0]);

/// Triples tried beyond the three lists' product, each a full pass unless it resolves to
/// the terms of one before it (no floor at the shared efficiency, 0.8, runs once):
/// - no prefill floor at all, at each grouped-GEMM efficiency: a kernel whose prefills
///   need no fixed cost per expert (vLLM's fp8 Qwen3-235B on H200 measures 154-176 ms of TTFT
///   for 1,000-token prompts at TP4 and 28-48 clients, where the smallest floor tried, 4 us,
///   already gives 350-400);
/// - a compute side at a dense GEMM's efficiency (1.0) beside slow streaming (0.3, 0.45),
///   with the shared floor, 4 us or none: a kernel that computes a large prefill's tiles as
///   fast as a dense GEMM but streams a decode's weights at a fraction of the rate (those
///   rows' TPOT is about twice the simulated, -46% signed median, while their TTFT is long).
pub const EXTRA_CANDIDATES: [(Option<f64>, Option<f64>, Option<f64>); 11] = [
    (None, Some(0.0), None),
    (Some(0.3), Some(0.0), None),
    (Some(0.45), Some(0.0), None),
    (Some(0.8), Some(0.0), None),
    (Some(1.0), Some(0.0), None),
    (Some(0.3), None, Some(1.0)),
    (Some(0.45), None, Some(1.0)),
    (Some(0.3), Some(4.0), Some(1.0)),
    (Some(0.45), Some(4.0), Some(1.0)),
    (Some(0.3), Some(0.0), Some(1.0)),
    (Some(0.45), Some(0.0), Some(1.0)),
];

/// The three lists' product: every `(efficiency, floor)` pair with each compute side.
const PRODUCT: usize = GEMM_CANDIDATES.len() * PREFILL_CANDIDATES.len() * COMPUTE_CANDIDATES.len();

/// Candidate `c` as `(moe_gemm_eff, moe_prefill_expert_us, moe_compute_eff)`: every triple
/// of the three lists, the shared one first, then [`EXTRA_CANDIDATES`].
fn candidate(c: usize) -> (Option<f64>, Option<f64>, Option<f64>) {
    let (g, p) = (GEMM_CANDIDATES.len(), PREFILL_CANDIDATES.len());
    if c >= PRODUCT {
        return EXTRA_CANDIDATES[c - PRODUCT];
    }
    (
        GEMM_CANDIDATES[c % g],
        PREFILL_CANDIDATES[c / g % p],
        COMPUTE_CANDIDATES[c / (g * p)],
    )
}

/// How many candidates each group (GPU, expert format and shape) chooses from.
const CANDIDATES: usize = PRODUCT + EXTRA_CANDIDATES.len();

/// Whether candidate `c` is offered only where the kernel dequantises ([`DEQUANTISING_ONLY`]).
fn dequantising_only(c: usize) -> bool {
    let pairs = GEMM_CANDIDATES.len() * PREFILL_CANDIDATES.len();
    c < PRODUCT && DEQUANTISING_ONLY[c / pairs]
}
const _: () = assert!(
    GEMM_CANDIDATES[0].is_none()
        && PREFILL_CANDIDATES[0].is_none()
        && COMPUTE_CANDIDATES[0].is_none()
);

/// Whether a row's experts run through a kernel that dequantises their weights on its GPU
/// (the rows offered the quarter of [`COMPUTE_CANDIDATES`], and the only ones offered a
/// compute side at all under the smaller offer of [`nested_offer`]; a row the catalog
/// cannot place is not simulated at all).
fn dequantised(row: &AggregateRow) -> bool {
    silicon::catalog_of(row).is_ok_and(|(_, gpu, dtype)| {
        crate::catalog::find_gpu(gpu).is_some_and(|g| g.dequantises(dtype))
    })
}

/// The row's experts' format and shape (`None`: a row the catalog cannot place, never
/// simulated).
fn kernel_of(row: &AggregateRow) -> Option<(ExpertFormat, ExpertShape)> {
    let (_, _, dtype) = silicon::catalog_of(row).ok()?;
    let shape = ExpertShape::of(crate::catalog::find_model_by_id(&row.model)?)?;
    Some((ExpertFormat::of(dtype), shape))
}

/// What each choice is made for: a GPU, the experts' format there and their shape (the
/// grouped GEMMs' dimensions, by which a kernel picks its tiles).
pub type Group = (&'static str, ExpertFormat, ExpertShape);

/// Where a fitted triple applies: a GPU, for every expert format (`None`) or for one, and
/// for every shape of that format (`None`) or for one.
pub type Scope = (&'static str, Option<ExpertFormat>, Option<ExpertShape>);

/// The weights of a group's median absolute TTFT error against its TPOT's that each fold
/// chooses from ([`nested_weight`]; 1: their plain sum).
pub const TTFT_WEIGHTS: [f64; 4] = [1.0, 1.5, 2.0, 3.0];

/// What one GPU's (or one GPU's and format's, or one shape's there) fit departs from the
/// shared terms by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeKernels {
    /// `moe_gemm_eff` there (`None`: the shared value).
    pub gemm_eff: Option<f64>,
    /// `moe_prefill_expert_us` there (`None`: the shared value).
    pub prefill_expert_us: Option<f64>,
    /// `moe_compute_eff` there (`None`: the grouped-GEMM efficiency).
    pub compute_eff: Option<f64>,
}

/// One engine's fit.
#[derive(Debug, Clone)]
pub struct MoeEngineFit {
    /// Engine (`vllm`, `sglang`, `trtllm`).
    pub engine: String,
    /// Rows fitted.
    pub rows: usize,
    /// The shared `(moe_gemm_eff, moe_prefill_expert_us)` the candidates replace.
    pub shared: (f64, f64),
    /// Each GPU's (or GPU's and format's, or GPU's, format's and shape's) terms fitted on
    /// every row, where they depart from the shared values.
    pub by_gpu: Vec<(Scope, MoeKernels)>,
    /// The groups (GPU, a format the tensor cores take, shape) whose fit on every row is offered a
    /// compute side (every other is offered one only where the kernel dequantises), as
    /// [`nested_offer`] decided.
    pub compute_offered: Vec<Group>,
    /// Each fold's choices.
    pub fold_fits: Vec<Vec<(Scope, MoeKernels)>>,
    /// Each fold's `compute_offered`.
    pub fold_compute_offered: Vec<Vec<Group>>,
    /// The weight of the TTFT's median against the TPOT's in each group's choice on every
    /// row, as [`nested_weight`] chose it.
    pub ttft_weight: f64,
    /// Each fold's `ttft_weight`.
    pub fold_ttft_weights: Vec<f64>,
    /// Held-out signed TTFT errors (one per row).
    pub held_out_ttft: Vec<f64>,
    /// Held-out signed TPOT errors (one per row).
    pub held_out_tpot: Vec<f64>,
    /// `(row index, fold)` of each held-out error.
    pub held_out_rows: Vec<(usize, usize)>,
    /// TTFT errors under the shared terms (the baseline), by row index.
    pub baseline_ttft: Vec<f64>,
    /// TPOT errors under the shared terms, by row index.
    pub baseline_tpot: Vec<f64>,
    /// The rows' ids, by index.
    pub ids: Vec<String>,
}

/// The non-default choices as `(scope, terms)`: a GPU's where every format and shape of its
/// rows chose the same triple without a compute side; else a format's where its shapes
/// chose the same triple; else each shape's that departs from the shared one (a compute
/// side is the format's kernels', so it is not carried over to a format the rows lack, and
/// a shape the rows lack takes its format's terms, or the GPU's, or the shared ones).
fn values(choice: &[(Group, usize)]) -> Vec<(Scope, MoeKernels)> {
    let terms = |c: usize| {
        let (gemm_eff, prefill_expert_us, compute_eff) = candidate(c);
        MoeKernels {
            gemm_eff,
            prefill_expert_us,
            compute_eff,
        }
    };
    let mut gpus: Vec<&'static str> = choice.iter().map(|((g, _, _), _)| *g).collect();
    gpus.sort_unstable();
    gpus.dedup();
    let mut out = Vec::new();
    for g in gpus {
        let mine: Vec<(ExpertFormat, ExpertShape, usize)> = choice
            .iter()
            .filter(|((n, _, _), _)| *n == g)
            .map(|&((_, f, s), c)| (f, s, c))
            .collect();
        if mine.iter().all(|&(_, _, c)| c == mine[0].2) && candidate(mine[0].2).2.is_none() {
            if mine[0].2 != 0 {
                out.push(((g, None, None), terms(mine[0].2)));
            }
            continue;
        }
        let mut formats: Vec<ExpertFormat> = mine.iter().map(|&(f, _, _)| f).collect();
        formats.sort_unstable();
        formats.dedup();
        for f in formats {
            let shapes: Vec<(ExpertShape, usize)> = mine
                .iter()
                .filter(|&&(n, _, _)| n == f)
                .map(|&(_, s, c)| (s, c))
                .collect();
            if shapes.iter().all(|&(_, c)| c == shapes[0].1) {
                if shapes[0].1 != 0 {
                    out.push(((g, Some(f), None), terms(shapes[0].1)));
                }
            } else {
                out.extend(
                    shapes
                        .iter()
                        .filter(|&&(_, c)| c != 0)
                        .map(|&(s, c)| ((g, Some(f), Some(s)), terms(c))),
                );
            }
        }
    }
    out
}

/// The candidates' errors as one offer makes them: a candidate `everywhere` rejects is
/// offered only to the rows whose kernel dequantises the experts' weights (`moving`, by
/// row), every other row getting infinite errors under it, so that no group of
/// theirs (every row of a group dequantises, or none) chooses it.
fn offered(by: &[Errors], moving: &[bool], everywhere: impl Fn(usize) -> bool) -> Vec<Errors> {
    by.iter()
        .enumerate()
        .map(|(c, errors)| {
            if everywhere(c) {
                errors.clone()
            } else {
                errors
                    .iter()
                    .zip(moving)
                    .map(|(&e, &m)| if m { e } else { (f64::INFINITY, f64::INFINITY) })
                    .collect()
            }
        })
        .collect()
}

/// The smaller offer: a compute side only where the kernel dequantises.
fn only_dequantising(by: &[Errors], moving: &[bool]) -> Vec<Errors> {
    offered(by, moving, |c| candidate(c).2.is_none())
}

/// The larger offer: a compute side for every format, but the quarter
/// ([`DEQUANTISING_ONLY`]) still only where the kernel dequantises.
fn every_format(by: &[Errors], moving: &[bool]) -> Vec<Errors> {
    offered(by, moving, |c| !dequantising_only(c))
}

/// Which of `variants` (each the candidates' errors by row, as one offer of candidates)
/// `train` holds out best: each is chosen per group on `folds - 1` parts of
/// `train` and tested on the last part, in turn, and the variant with the smallest sum of
/// the median absolute TTFT and TPOT errors over those held-out parts wins (the first on
/// a tie). [`nested_offer`] runs this on each group's rows among a fold's training
/// rows, so the held-out fold plays no part in the choice.
fn nested_choice(variants: &[Vec<Errors>], gpus: &[Group], train: &[usize], folds: usize) -> usize {
    let score = |by: &[Errors]| {
        let (t, p) = inner_held_out(by, gpus, train, folds, 1.0);
        median_abs(&t) + median_abs(&p)
    };
    (0..variants.len())
        .map(|v| (v, score(&variants[v])))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map_or(0, |(v, _)| v)
}

/// The TTFT and TPOT errors of `train`'s rows, each held out of a `folds`-fold inside
/// `train` (the rows' choices made per group on the other parts, with the TTFT's median
/// weighted `ttft_weight` times the TPOT's).
fn inner_held_out(
    by: &[Errors],
    groups: &[Group],
    train: &[usize],
    folds: usize,
    ttft_weight: f64,
) -> (Vec<f64>, Vec<f64>) {
    let (mut t, mut p) = (Vec::new(), Vec::new());
    for f in 0..folds {
        let inner: Vec<usize> = train
            .iter()
            .enumerate()
            .filter(|(j, _)| j % folds != f)
            .map(|(_, &i)| i)
            .collect();
        let (_, errors) = per_gpu_weighted(by, groups, &inner, ttft_weight);
        for &i in train.iter().skip(f).step_by(folds) {
            t.push(errors[i].0);
            p.push(errors[i].1);
        }
    }
    (t, p)
}

/// The weight of the TTFT's median against the TPOT's (of [`TTFT_WEIGHTS`]) under which
/// `train`'s groups choose their triples: the one whose choices hold out best in a
/// `folds`-fold inside `train`, by the larger of the held-out TTFT and TPOT medians (the
/// measure a deployment is held to, both under one bound), the smallest weight on a tie.
/// Each group's own choice weighs the two as it is told: TTFT and TPOT pull a group's terms
/// in opposite directions, and which way serves both medians best is for held-out rows to
/// say, not for the training rows, on which the plain sum never loses.
fn nested_weight(by: &[Errors], groups: &[Group], train: &[usize], folds: usize) -> f64 {
    TTFT_WEIGHTS
        .iter()
        .map(|&w| {
            let (t, p) = inner_held_out(by, groups, train, folds, w);
            (w, median_abs(&t).max(median_abs(&p)))
        })
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map_or(1.0, |(w, _)| w)
}

/// The GPUs and formats of `train` that take the larger of `variants`' two offers (the
/// second): each group's own rows decide, by [`nested_choice`] over them alone (a group
/// with fewer rows than folds keeps the smaller). The question is a kernel's (does the
/// grouped GEMM of these experts on this GPU compute apart from its streaming?), so it is
/// asked per group, as the candidates are chosen.
fn nested_offer(
    variants: &[Vec<Errors>],
    gpus: &[Group],
    train: &[usize],
    folds: usize,
) -> Vec<Group> {
    let mut groups: Vec<Group> = train.iter().map(|&i| gpus[i]).collect();
    groups.sort_unstable();
    groups.dedup();
    groups.retain(|&g| {
        let rows: Vec<usize> = train.iter().copied().filter(|&i| gpus[i] == g).collect();
        rows.len() >= folds && nested_choice(variants, gpus, &rows, folds) == 1
    });
    groups
}

/// The candidates' errors with the rows of the groups in `larger` under the second of
/// `variants`' offers and every other row under the first.
fn under_offers(variants: &[Vec<Errors>], gpus: &[Group], larger: &[Group]) -> Vec<Errors> {
    (0..variants[0].len())
        .map(|c| {
            (0..gpus.len())
                .map(|i| variants[usize::from(larger.contains(&gpus[i]))][c][i])
                .collect()
        })
        .collect()
}

/// One engine's rows under every candidate: the ids of the rows every candidate simulated
/// (the efficiencies do not change what fits in memory, so all of them), in the first
/// pass's order, their GPUs, and each candidate's errors on them, by candidate. A candidate
/// that resolves to the same terms as an earlier one (the grouped-GEMM candidate equal to
/// the shared value) reuses its pass; one offered only to dequantising kernels simulates
/// again only the rows whose experts are dequantised (the others keep the same pair's
/// errors, and `offered` takes the candidate out of their reach).
type Passes = (Vec<String>, Vec<&'static str>, Vec<Errors>);

/// Simulates `mine` under every candidate over `prior` ([`Passes`]).
fn simulate_passes(mine: &[AggregateRow], prior: &EngineCost) -> Result<Passes, crate::SimError> {
    let defaults = crate::cost_model::CostParams::default();
    let pairs = GEMM_CANDIDATES.len() * PREFILL_CANDIDATES.len();
    let mut passes: Vec<LinedPass> = Vec::new();
    let mut terms: Vec<([f64; 3], bool)> = Vec::new();
    for c in 0..CANDIDATES {
        let (eff, us, compute) = candidate(c);
        let cost = EngineCost {
            moe_gemm_eff: eff.or(prior.moe_gemm_eff),
            moe_prefill_expert_us: us.or(prior.moe_prefill_expert_us),
            moe_compute_eff: compute,
            ..*prior
        };
        let gemm = cost.moe_gemm_eff.unwrap_or(defaults.moe_gemm_eff);
        let only = dequantising_only(c);
        let resolved = (
            [
                gemm,
                cost.moe_prefill_expert_us
                    .unwrap_or(defaults.moe_prefill_expert_us),
                cost.moe_compute_eff.unwrap_or(gemm),
            ],
            only,
        );
        let pass = if let Some(same) = terms.iter().position(|t| *t == resolved) {
            passes[same].clone()
        } else if !only {
            pass_with_lines(mine, &|_| cost)?
        } else {
            let (ids, gpus, base, index) = &passes[c % pairs];
            let errors = pass_moving(mine, &dequantised, (index, base), &|_| cost)?;
            (ids.clone(), gpus.clone(), errors, index.clone())
        };
        terms.push(resolved);
        passes.push(pass);
    }
    let maps: Vec<std::collections::HashMap<&str, (f64, f64)>> = passes
        .iter()
        .map(|(ids, _, errors, _)| {
            ids.iter()
                .map(String::as_str)
                .zip(errors.iter().copied())
                .collect()
        })
        .collect();
    let (first_ids, first_gpus, _, _) = &passes[0];
    let keep: Vec<usize> = (0..first_ids.len())
        .filter(|&i| maps.iter().all(|m| m.contains_key(first_ids[i].as_str())))
        .collect();
    let ids: Vec<String> = keep.iter().map(|&i| first_ids[i].clone()).collect();
    let gpus = keep.iter().map(|&i| first_gpus[i]).collect();
    let by = maps
        .iter()
        .map(|m| ids.iter().map(|id| m[id.as_str()]).collect())
        .collect();
    Ok((ids, gpus, by))
}

/// The header of a passes file: what the passes were simulated over (the rows, the prior's
/// terms and the candidates), which must match for the file to be reused. The simulator's
/// own code is not in it: a file kept before a change to how rows are simulated must be
/// deleted by hand.
fn passes_header(mine: &[AggregateRow], prior: &EngineCost) -> String {
    let candidates: Vec<String> = (0..CANDIDATES)
        .map(|c| format!("{:?}", candidate(c)))
        .collect();
    let lines: u64 = mine.iter().map(|r| r.line).sum();
    format!(
        "# {} rows (lines summing to {lines}); prior {prior:?}; candidates {}",
        mine.len(),
        candidates.join(" ")
    )
}

/// The last line of a passes file of `rows` rows.
fn closing_line(rows: usize) -> String {
    format!("# {rows} rows")
}

/// A passes file's rows (see [`cached_passes`]): `None` when its header is not `header` (other
/// rows, terms or candidates: simulate again), else the rows or why one line is bad.
fn read_passes(text: &str, header: &str, mine: &[AggregateRow]) -> Option<Result<Passes, String>> {
    if text.lines().next() != Some(header) {
        return None;
    }
    let known: std::collections::HashSet<&str> = mine.iter().map(|r| r.id.as_str()).collect();
    let body = text
        .split_once('\n')
        .map_or("", |(_, b)| b)
        .trim_end_matches('\n');
    // The closing `# N rows` line: a file cut short at a line's end is caught by it.
    let (body, closing) = match body.rsplit_once('\n') {
        Some((rows, last)) if last.starts_with('#') => (rows, Some(last)),
        _ if body.starts_with('#') => ("", Some(body)),
        _ => (body, None),
    };
    let read = || {
        let (mut ids, mut gpus) = (Vec::new(), Vec::new());
        let mut seen = std::collections::HashSet::new();
        let mut by: Vec<Errors> = vec![Vec::new(); CANDIDATES];
        let mut rdr = csv::ReaderBuilder::new()
            .has_headers(false)
            .from_reader(body.as_bytes());
        for (n, record) in rdr.records().enumerate() {
            let at = |what: String| format!("line {}: {what}", n + 2);
            let cells = record.map_err(|e| at(e.to_string()))?;
            if cells.len() != 2 + 2 * CANDIDATES {
                return Err(at(format!(
                    "expected {} cells, found {}",
                    2 + 2 * CANDIDATES,
                    cells.len()
                )));
            }
            if !known.contains(&cells[0]) {
                return Err(at(format!(
                    "row `{}` is not one of the engine's",
                    &cells[0]
                )));
            }
            if !seen.insert(cells[0].to_string()) {
                return Err(at(format!("row `{}` a second time", &cells[0])));
            }
            let gpu = crate::catalog::find_gpu(&cells[1])
                .ok_or_else(|| at(format!("unknown GPU `{}`", &cells[1])))?;
            ids.push(cells[0].to_string());
            gpus.push(gpu.name);
            for (c, errors) in by.iter_mut().enumerate() {
                let num = |k: usize| {
                    cells[k]
                        .parse::<f64>()
                        .map_err(|_| at(format!("`{}` is not a number", &cells[k])))
                };
                errors.push((num(2 + 2 * c)?, num(3 + 2 * c)?));
            }
        }
        if closing != Some(closing_line(ids.len()).as_str()) {
            return Err(format!(
                "line {}: expected `{}`, the closing line, found {}: the file is cut short or edited",
                ids.len() + 2,
                closing_line(ids.len()),
                closing.map_or("the end".to_string(), |c| format!("`{c}`"))
            ));
        }
        Ok((ids, gpus, by))
    };
    Some(read())
}

/// [`simulate_passes`] kept in `dir` (`moe-engines-<engine>.passes.csv`: a header naming the
/// rows, the prior and the candidates, then per row its id, GPU and each candidate's TTFT and TPOT
/// errors, then a closing line counting the rows): read back when its header matches (every row it names must be one of `mine`),
/// else simulated and written. The choices and folds are then redone from it, which is
/// what lets a change to how the stage chooses be tried in seconds instead of half an hour.
fn cached_passes(
    dir: &std::path::Path,
    engine: &str,
    mine: &[AggregateRow],
    prior: &EngineCost,
) -> Result<Passes, crate::SimError> {
    let path = dir.join(format!("moe-engines-{engine}.passes.csv"));
    let header = passes_header(mine, prior);
    let stale = |msg: String| {
        crate::SimError::Scenario(crate::scenario::ScenarioError {
            file: path.display().to_string(),
            msg,
        })
    };
    if let Ok(text) = std::fs::read_to_string(&path) {
        if let Some(read) = read_passes(&text, &header, mine) {
            return read.map_err(stale);
        }
    }
    let (ids, gpus, by) = simulate_passes(mine, prior)?;
    let mut w = csv::Writer::from_writer(Vec::new());
    for (i, (id, gpu)) in ids.iter().zip(&gpus).enumerate() {
        let mut record = vec![id.clone(), gpu.to_string()];
        for errors in &by {
            // Rust's shortest round-trip form: read back, the same f64.
            record.push(errors[i].0.to_string());
            record.push(errors[i].1.to_string());
        }
        w.write_record(&record).map_err(|e| stale(e.to_string()))?;
    }
    let body = w.into_inner().map_err(|e| stale(e.to_string()))?;
    let text = format!(
        "{header}\n{}{}\n",
        String::from_utf8_lossy(&body),
        closing_line(ids.len())
    );
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&path, text))
        .map_err(|e| stale(e.to_string()))?;
    Ok((ids, gpus, by))
}

/// Fits each engine's grouped-GEMM efficiency, prefill floor and compute side per GPU,
/// expert format and experts' shape on its mixture-of-experts rows, `folds`-fold, with
/// `prior`'s terms (the shared fits) in place, offering a compute side to the formats the
/// tensor cores take as [`nested_offer`] decides per group, each group choosing under the
/// TTFT weight [`nested_weight`] chooses; the compute side is this stage's own (a prior's is not used:
/// unset, it is the grouped-GEMM efficiency, as the files say). With `passes`, the
/// simulated rows are kept in (and read back from) that folder ([`cached_passes`]).
pub fn fit_moe_engines(
    rows: &[AggregateRow],
    folds: usize,
    prior: &EngineCost,
    passes: Option<&std::path::Path>,
) -> Result<Vec<MoeEngineFit>, crate::SimError> {
    let folds = folds.max(2);
    let mut engines: Vec<String> = rows
        .iter()
        .filter(|r| r.is_moe())
        .map(|r| r.backend.clone())
        .collect();
    engines.sort();
    engines.dedup();
    let defaults = crate::cost_model::CostParams::default();
    let shared = (
        prior.moe_gemm_eff.unwrap_or(defaults.moe_gemm_eff),
        prior
            .moe_prefill_expert_us
            .unwrap_or(defaults.moe_prefill_expert_us),
    );
    let mut fits = Vec::new();
    for engine in engines {
        let mine: Vec<AggregateRow> = rows
            .iter()
            .filter(|r| r.backend == engine && r.is_moe())
            .cloned()
            .collect();
        let (ids, sim_gpus, by) = match passes {
            Some(dir) => cached_passes(dir, &engine, &mine, prior)?,
            None => simulate_passes(&mine, prior)?,
        };
        let kernels: std::collections::HashMap<&str, (ExpertFormat, ExpertShape)> = mine
            .iter()
            .filter_map(|r| kernel_of(r).map(|k| (r.id.as_str(), k)))
            .collect();
        // Every simulated row was placed by the catalog, so it has a format and a shape.
        let gpus: Vec<Group> = ids
            .iter()
            .zip(&sim_gpus)
            .filter_map(|(id, &g)| kernels.get(id.as_str()).map(|&(f, s)| (g, f, s)))
            .collect();
        if gpus.len() != ids.len() {
            return Err(crate::SimError::Scenario(crate::scenario::ScenarioError {
                file: "silicon rows".into(),
                msg: format!(
                    "{} of {engine}'s simulated mixture-of-experts rows have no expert format or shape",
                    ids.len() - gpus.len()
                ),
            }));
        }
        let n = ids.len();
        if n < folds {
            continue;
        }
        let dequantising: std::collections::HashSet<&str> = mine
            .iter()
            .filter(|r| dequantised(r))
            .map(|r| r.id.as_str())
            .collect();
        let moving: Vec<bool> = ids
            .iter()
            .map(|id| dequantising.contains(id.as_str()))
            .collect();
        // A compute side offered only where the kernel dequantises is offered to a group
        // whole: every row of a group dequantises, or none.
        let mut kind: std::collections::HashMap<Group, bool> = Default::default();
        for (g, &m) in gpus.iter().zip(&moving) {
            if *kind.entry(*g).or_insert(m) != m {
                return Err(crate::SimError::Scenario(crate::scenario::ScenarioError {
                    file: "silicon rows".into(),
                    msg: format!(
                        "{engine}'s {} rows in {} experts of shape {} mix kernels that dequantise the weights and kernels that do not",
                        g.0,
                        g.1.name(),
                        g.2.name()
                    ),
                }));
            }
        }
        let variants = [only_dequantising(&by, &moving), every_format(&by, &moving)];
        // The engines' fits' fixed shuffle, so folds mix GPUs, models and loads.
        let mut idx: Vec<usize> = (0..n).collect();
        idx.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(17));
        let larger = nested_offer(&variants, &gpus, &idx, folds);
        let by_all = under_offers(&variants, &gpus, &larger);
        let weight = nested_weight(&by_all, &gpus, &idx, folds);
        let mut fit = MoeEngineFit {
            engine,
            rows: n,
            shared,
            by_gpu: values(&per_gpu_weighted(&by_all, &gpus, &idx, weight).0),
            compute_offered: larger,
            ttft_weight: weight,
            fold_fits: Vec::new(),
            fold_compute_offered: Vec::new(),
            fold_ttft_weights: Vec::new(),
            held_out_ttft: Vec::new(),
            held_out_tpot: Vec::new(),
            held_out_rows: Vec::new(),
            baseline_ttft: by[0].iter().map(|e| e.0).collect(),
            baseline_tpot: by[0].iter().map(|e| e.1).collect(),
            ids,
        };
        for f in 0..folds {
            let train: Vec<usize> = (0..n).filter(|j| j % folds != f).map(|j| idx[j]).collect();
            let larger = nested_offer(&variants, &gpus, &train, folds);
            let by_fold = under_offers(&variants, &gpus, &larger);
            let weight = nested_weight(&by_fold, &gpus, &train, folds);
            let (choice, errors) = per_gpu_weighted(&by_fold, &gpus, &train, weight);
            for j in (f..n).step_by(folds) {
                let i = idx[j];
                fit.held_out_ttft.push(errors[i].0);
                fit.held_out_tpot.push(errors[i].1);
                fit.held_out_rows.push((i, f));
            }
            fit.fold_fits.push(values(&choice));
            fit.fold_compute_offered.push(larger);
            fit.fold_ttft_weights.push(weight);
        }
        fits.push(fit);
    }
    Ok(fits)
}

/// `b200 0.80 / 12 us, h200 fp8 0.45 / compute 0.25` (or `shared 0.6 / 8 us everywhere`):
/// each GPU's (or GPU's and expert format's, or shape's there) efficiency, then its prefill floor and its
/// compute side's efficiency where those depart.
fn describe(v: &[(Scope, MoeKernels)], shared: (f64, f64)) -> String {
    if v.is_empty() {
        return format!("shared {} / {} us everywhere", shared.0, shared.1);
    }
    v.iter()
        .map(|(scope, k)| {
            let scope = scope_name(*scope);
            let mut s = format!(
                "{scope} {}",
                k.gemm_eff
                    .map_or_else(|| "-".to_string(), |e| format!("{e:.2}"))
            );
            if let Some(us) = k.prefill_expert_us {
                s.push_str(&format!(" / {us} us"));
            }
            if let Some(e) = k.compute_eff {
                s.push_str(&format!(" / compute {e:.2}"));
            }
            s
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A scope in words: `b200`, `b200 fp8` or `b200 fp8 7168x2048`.
fn scope_name((g, f, s): Scope) -> String {
    let mut out = g.to_string();
    if let Some(f) = f {
        out.push(' ');
        out.push_str(f.name());
    }
    if let Some(s) = s {
        out.push(' ');
        out.push_str(&s.name());
    }
    out
}

/// A GPU's keys as TOML `key = value` pairs.
fn keys(k: &MoeKernels) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(e) = k.gemm_eff {
        out.push(format!("moe_gemm_eff = {e:.2}"));
    }
    if let Some(us) = k.prefill_expert_us {
        out.push(format!("moe_prefill_expert_us = {us:.1}"));
    }
    if let Some(e) = k.compute_eff {
        out.push(format!("moe_compute_eff = {e:.2}"));
    }
    out
}

/// The groups (GPU, a format the tensor cores take, shape) that a fit offered a compute
/// side, in words (`h200 fp8 7168x2048, b200 fp4 2880x2880`, or `none`).
fn offer(groups: &[Group]) -> String {
    if groups.is_empty() {
        return "none".to_string();
    }
    let names: Vec<String> = groups
        .iter()
        .map(|&(g, f, s)| scope_name((g, Some(f), Some(s))))
        .collect();
    names.join(", ")
}

/// The calibration file of one engine's fit: `[cost.by_gpu.<gpu>] moe_gemm_eff`,
/// `moe_prefill_expert_us` and `moe_compute_eff` (under `[cost.by_gpu.<gpu>.experts.<format>]`
/// where the GPU's formats parted, and `.experts.<format>.shapes.<hidden>x<intermediate>`
/// where a format's shapes did), and the `[fit]` table.
pub fn fit_toml(fit: &MoeEngineFit, source: &str, folds: usize) -> String {
    let folds_text: Vec<String> = fit
        .fold_fits
        .iter()
        .map(|f| describe(f, fit.shared))
        .collect();
    let framework = framework_name(&fit.engine);
    let held = held_out_figures(
        (&fit.held_out_ttft, &fit.held_out_tpot),
        (&fit.baseline_ttft, &fit.baseline_tpot),
    )
    .quote("shared", [" ", "\n# "]);
    let mut text = format!(
        "# {engine}: the grouped-GEMM efficiency of its mixture-of-experts kernels, their compute side's where it departs,\n\
         # and their fixed cost per expert and MoE layer of a prefill on each GPU (per expert format where they part:\n\
         # `experts.fp8`, `experts.fp4`, and per experts' shape, hidden x intermediate size, where those part:\n\
         # `experts.fp8.shapes.7168x2048`), fitted by `sim calibrate --observed {source}`\n\
         # to {rows} mixture-of-experts rows of {engine} (aiconfigurator silicon.csv) with the shared MoE terms (moe-*.toml,\n\
         # the defaults) in place. {folds}-fold held-out: {held}; the folds' fits (efficiency / floor / compute side): {ff}.\n\
         # A compute side is offered where the kernel dequantises the experts, and to the formats the tensor cores take where a {folds}-fold\n\
         # inside each GPU, format and shape's rows chose it: {offer} (each fold's, inside its training rows{offers}).\n\
         # Each group weighs its median |TTFT err| {weight} times its median |TPOT err| in choosing, the weight (of {weights})\n\
         # whose choices held out best, by the larger of the two medians, in a {folds}-fold inside the rows (each fold's: {fold_weights}).\n\
         # Held out of this fit only: the shared terms under it were fitted to every engine's rows, these included.\n\
         # For a mixture of experts served by {engine}: `cost.calibration` = this file (not with observed-{engine}.toml,\n\
         # whose terms were fitted to dense models and not used here). A shape a format's `shapes` do not list takes the\n\
         # format's own terms where the file gives them (its shapes agreed), a format a GPU's table does not list (or a\n\
         # shape of a format without terms of its own) the GPU's own terms where it has them (the engine's kernels there),\n\
         # else, like GPUs not listed, the shared\n\
         # `moe_gemm_eff` ({eff}) and `moe_prefill_expert_us` ({us}), and computes at that efficiency.\n\
         # Fitted under the engine's serving defaults (`sim validate-model`): [engine] {keys}.\n\
         [cost]\nframework = \"{framework}\"\n",
        keys = silicon::engine_keys(&fit.engine),
        engine = fit.engine,
        rows = fit.rows,
        ff = folds_text.join(" / "),
        offer = offer(&fit.compute_offered),
        offers = if fit.fold_compute_offered.iter().all(|e| *e == fit.compute_offered) {
            ", every fold alike".to_string()
        } else {
            format!(
                ": {}",
                fit.fold_compute_offered
                    .iter()
                    .map(|e| offer(e))
                    .collect::<Vec<_>>()
                    .join(" / ")
            )
        },
        eff = fit.shared.0,
        us = fit.shared.1,
        weight = fit.ttft_weight,
        weights = TTFT_WEIGHTS
            .iter()
            .map(f64::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        fold_weights = fit
            .fold_ttft_weights
            .iter()
            .map(f64::to_string)
            .collect::<Vec<_>>()
            .join(" / "),
    );
    // A GPU's entry inline: its own keys, and its formats' under `experts` (each with its
    // own keys and its shapes' under `shapes`).
    let table = |v: &[(Scope, MoeKernels)]| -> String {
        let mut gpus: Vec<&'static str> = v.iter().map(|((g, _, _), _)| *g).collect();
        gpus.sort_unstable();
        gpus.dedup();
        let entries: Vec<String> = gpus
            .iter()
            .map(|&g| {
                let mine: Vec<&(Scope, MoeKernels)> =
                    v.iter().filter(|((n, _, _), _)| *n == g).collect();
                let mut inner: Vec<String> = mine
                    .iter()
                    .filter(|((_, f, _), _)| f.is_none())
                    .flat_map(|(_, k)| keys(k))
                    .collect();
                let mut formats: Vec<ExpertFormat> =
                    mine.iter().filter_map(|((_, f, _), _)| *f).collect();
                formats.sort_unstable();
                formats.dedup();
                let formats: Vec<String> = formats
                    .iter()
                    .map(|&f| {
                        let of_f = mine.iter().filter(|((_, n, _), _)| *n == Some(f));
                        let mut cells: Vec<String> = of_f
                            .clone()
                            .filter(|((_, _, s), _)| s.is_none())
                            .flat_map(|(_, k)| keys(k))
                            .collect();
                        let shapes: Vec<String> = of_f
                            .filter_map(|((_, _, s), k)| {
                                s.map(|s| format!("{} = {{ {} }}", s.name(), keys(k).join(", ")))
                            })
                            .collect();
                        if !shapes.is_empty() {
                            cells.push(format!("shapes = {{ {} }}", shapes.join(", ")));
                        }
                        format!("{} = {{ {} }}", f.name(), cells.join(", "))
                    })
                    .collect();
                if !formats.is_empty() {
                    inner.push(format!("experts = {{ {} }}", formats.join(", ")));
                }
                format!("{g} = {{ {} }}", inner.join(", "))
            })
            .collect();
        format!("{{ by_gpu = {{ {} }} }}", entries.join(", "))
    };
    for ((g, f, shape), k) in &fit.by_gpu {
        // A shape's terms are always a format's ([`values`] writes no other).
        debug_assert!(
            f.is_some() || shape.is_none(),
            "{g}: a shape without its format"
        );
        match (f, shape) {
            (Some(f), Some(s)) => text.push_str(&format!(
                "[cost.by_gpu.{g}.experts.{}.shapes.{}]\n",
                f.name(),
                s.name()
            )),
            (Some(f), None) => text.push_str(&format!("[cost.by_gpu.{g}.experts.{}]\n", f.name())),
            (None, _) => text.push_str(&format!("[cost.by_gpu.{g}]\n")),
        }
        for line in keys(k) {
            text.push_str(&line);
            text.push('\n');
        }
    }
    let folds_list: Vec<String> = fit.fold_fits.iter().map(|f| table(f)).collect();
    text.push_str(&fit_record_toml(
        &format!(
            "sim calibrate --observed {source}: grouped-GEMM efficiency, prefill floor and compute side's efficiency per GPU, expert format and experts' shape of {}, {folds}-fold on {} mixture-of-experts rows",
            fit.engine, fit.rows
        ),
        &folds_list,
        &fit.held_out_ttft,
        &fit.held_out_tpot,
    ));
    text
}

/// Every row's held-out errors beside the shared terms' (as the engines' fits write them).
pub fn fit_rows_csv(fit: &MoeEngineFit) -> Result<String, crate::SimError> {
    held_out_csv(
        &format!("observed-moe-{}.rows.csv", fit.engine),
        &fit.ids,
        &fit.held_out_rows,
        (&fit.held_out_ttft, &fit.held_out_tpot),
        (&fit.baseline_ttft, &fit.baseline_tpot),
    )
}

/// The fits as a table, with every engine's rows together (held-out errors in percent).
pub fn fit_table(fits: &[MoeEngineFit]) -> String {
    let mut s = String::from(
        "engine   rows  moe_gemm_eff / prefill / compute by GPU TTFT |err| held out p50 / p90 (shared p50)   TPOT |err| held out p50 / p90 (shared p50)\n",
    );
    let mut all = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut line = |name: &str,
                    rows: usize,
                    effs: &str,
                    t: &[f64],
                    p: &[f64],
                    bt: &[f64],
                    bp: &[f64]| {
        let h = held_out_figures((t, p), (bt, bp));
        s.push_str(&format!(
            "{name:<8} {rows:>4}  {effs:<36} {:>8.1}% / {:>6.1}% ({:>5.1}%)              {:>8.1}% / {:>6.1}% ({:>5.1}%)\n",
            h.t, h.t90, h.bt, h.p, h.p90, h.bp,
        ));
    };
    for f in fits {
        line(
            &f.engine,
            f.rows,
            &describe(&f.by_gpu, f.shared),
            &f.held_out_ttft,
            &f.held_out_tpot,
            &f.baseline_ttft,
            &f.baseline_tpot,
        );
        all.0.extend_from_slice(&f.held_out_ttft);
        all.1.extend_from_slice(&f.held_out_tpot);
        all.2.extend_from_slice(&f.baseline_ttft);
        all.3.extend_from_slice(&f.baseline_tpot);
    }
    if fits.len() > 1 {
        line("all", all.0.len(), "", &all.0, &all.1, &all.2, &all.3);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::{
        candidate, describe, fit_toml, nested_choice, nested_offer, only_dequantising,
        passes_header, read_passes, under_offers, values, Errors, Group, MoeEngineFit, MoeKernels,
        CANDIDATES,
    };
    use crate::catalog::Dtype;
    use crate::cost_model::{ExpertFormat, ExpertShape};

    /// DeepSeek-V3's experts' shape.
    const DS: ExpertShape = ExpertShape {
        hidden: 7168,
        intermediate: 2048,
    };
    /// gpt-oss-120b's.
    const OSS: ExpertShape = ExpertShape {
        hidden: 2880,
        intermediate: 2880,
    };

    /// A GPU whose formats chose the same triple without a compute side is written once
    /// for every format; one whose formats parted, or chose a compute side (a format's own
    /// kernels'), per format (in the formats' order), leaving out those that kept the
    /// shared terms.
    #[test]
    fn a_gpus_formats_are_written_together_unless_they_part() {
        use ExpertFormat::{Fp4, Fp8};
        let with_compute = (0..CANDIDATES)
            .find(|&c| candidate(c).2 == Some(0.5))
            .expect("a compute side of 0.5");
        let v = values(&[
            (("b200", Fp4, DS), 4),
            (("b200", Fp8, DS), 4),
            (("gb200", Fp4, DS), with_compute),
            (("gb200", Fp8, DS), with_compute),
            (("h100-sxm", Fp8, DS), 0),
            (("h200", Fp4, DS), 0),
            (("h200", Fp8, DS), 3),
        ]);
        let scopes: Vec<_> = v.iter().map(|(s, _)| *s).collect();
        assert_eq!(
            scopes,
            [
                ("b200", None, None),
                ("gb200", Some(Fp8), None),
                ("gb200", Some(Fp4), None),
                ("h200", Some(Fp8), None)
            ]
        );
        assert_eq!(v[0].1.gemm_eff, candidate(4).0);
        assert_eq!(v[1].1.compute_eff, candidate(with_compute).2);
        assert_eq!(v[3].1.gemm_eff, candidate(3).0);
    }

    /// A format whose shapes chose the same triple is written once for all its shapes;
    /// one whose shapes parted, per shape, leaving out those that kept the shared terms;
    /// and the file's tables put each where a scenario of that shape finds it.
    #[test]
    fn a_formats_shapes_are_written_together_unless_they_part() {
        use ExpertFormat::{Fp4, Fp8};
        let v = values(&[
            (("b200", Fp4, DS), 4),
            (("b200", Fp4, OSS), 4),
            (("b200", Fp8, DS), 3),
            (("b200", Fp8, OSS), 0),
            (("h200", Fp8, DS), 2),
            (("h200", Fp8, OSS), 3),
        ]);
        let scopes: Vec<_> = v.iter().map(|(s, _)| *s).collect();
        assert_eq!(
            scopes,
            [
                ("b200", Some(Fp8), Some(DS)),
                ("b200", Some(Fp4), None),
                ("h200", Some(Fp8), Some(DS)),
                ("h200", Some(Fp8), Some(OSS)),
            ]
        );
        assert_eq!(
            describe(&v, (0.8, 8.0)),
            format!(
                "b200 fp8 7168x2048 {:.2}, b200 fp4 {:.2}, h200 fp8 7168x2048 {:.2}, h200 fp8 2880x2880 {:.2}",
                candidate(3).0.expect("an efficiency"),
                candidate(4).0.expect("an efficiency"),
                candidate(2).0.expect("an efficiency"),
                candidate(3).0.expect("an efficiency"),
            )
        );
        let mut fit = MoeEngineFit {
            engine: "sglang".into(),
            rows: 2,
            shared: (0.8, 8.0),
            by_gpu: v.clone(),
            compute_offered: vec![],
            ttft_weight: 2.0,
            fold_ttft_weights: vec![2.0, 3.0],
            fold_fits: vec![v.clone(), vec![]],
            fold_compute_offered: vec![vec![], vec![]],
            held_out_ttft: vec![0.1, -0.2],
            held_out_tpot: vec![0.02, -0.1],
            held_out_rows: vec![(0, 0), (1, 1)],
            baseline_ttft: vec![0.2, -0.3],
            baseline_tpot: vec![0.3, -0.4],
            ids: vec!["a".into(), "b".into()],
        };
        let text = fit_toml(&fit, "silicon.csv", 2);
        assert!(
            text.contains("weighs its median |TTFT err| 2 times")
                && text.contains("(each fold's: 2 / 3)"),
            "{text}"
        );
        let table: toml::Table = text.parse().expect("TOML");
        let cost: crate::cost_model::CostParams =
            toml::Value::Table(table["cost"].as_table().expect("[cost]").clone())
                .try_into()
                .expect("[cost]");
        cost.validate().expect("valid");
        let eff =
            |gpu: &str, d: Dtype, s: ExpertShape| cost.on_deployment(gpu, d, Some(s)).moe_gemm_eff;
        assert_eq!(Some(eff("b200", Dtype::Fp8, DS)), candidate(3).0);
        assert_eq!(eff("b200", Dtype::Fp8, OSS), cost.moe_gemm_eff);
        assert_eq!(Some(eff("b200", Dtype::Nvfp4, OSS)), candidate(4).0);
        assert_eq!(Some(eff("h200", Dtype::Fp8, OSS)), candidate(3).0);
        // A fold's inline table reads the same.
        let record =
            crate::cost_model::calibration::uncertainty::FitRecord::from_file_table(&table)
                .expect("[fit]")
                .expect("present");
        let fold = toml::Value::Table(record.folds[0].clone())
            .try_into::<crate::cost_model::CostParams>()
            .expect("a fold is [cost] keys");
        assert_eq!(fold, cost_without_framework(&cost));
        fit.by_gpu.clear();
        assert!(fit_toml(&fit, "silicon.csv", 2)
            .parse::<toml::Table>()
            .is_ok());
    }

    /// `cost` with the default framework, as a fold's inline table (which names none) reads.
    fn cost_without_framework(
        cost: &crate::cost_model::CostParams,
    ) -> crate::cost_model::CostParams {
        crate::cost_model::CostParams {
            framework: crate::cost_model::CostParams::default().framework,
            ..cost.clone()
        }
    }

    /// The TTFT's weight is chosen on rows held out inside the training rows: where the
    /// candidate that halves the TTFT errors doubles the TPOT errors of rows whose TPOT is
    /// far inside its bound, weighting the TTFT more holds out better by the larger median;
    /// where the TTFT is already the smaller, the plain sum (the smallest weight) stays.
    #[test]
    fn the_ttft_weight_is_chosen_on_rows_held_out_inside_the_training_rows() {
        use super::{nested_weight, TTFT_WEIGHTS};
        let n = 40;
        let gpus: Vec<Group> = vec![("h200", ExpertFormat::Fp8, DS); n];
        let train: Vec<usize> = (0..n).collect();
        let (other, base, mut by) = rising_errors(n);
        // Every row: TTFT 20-59%, TPOT 10% under the shared terms; the other candidate
        // halves the TTFT and makes the TPOT 35%: the plain sum of the medians rises (at a
        // TTFT median t below 50%, t/2 + 0.35 > t + 0.1) while the larger median falls
        // (0.35 < t about 0.4), and 1.5x the TTFT's median takes it (0.75t + 0.35 <
        // 1.5t + 0.1 above t = 0.33), ...
        by[other] = base.iter().map(|e| (e.0 * 0.5, e.1 * 3.5)).collect();
        let w = nested_weight(&by, &gpus, &train, 5);
        assert!(w > 1.0, "{w}");
        assert!(TTFT_WEIGHTS.contains(&w));
        // ... and with the TTFT already inside the TPOT, nothing is gained.
        by[other] = base.iter().map(|e| (e.0 * 0.1, e.1 * 3.0)).collect();
        let small: Errors = base.iter().map(|e| (e.0 * 0.1, e.1)).collect();
        by[0] = small;
        assert_eq!(nested_weight(&by, &gpus, &train, 5), TTFT_WEIGHTS[0]);
    }

    /// The file a fit writes is a calibration file a scenario reads: its `[cost]` and
    /// `[fit]` tables parse, and each GPU's efficiency lands under `by_gpu`.
    #[test]
    fn the_fit_file_is_a_calibration_a_scenario_reads() {
        let fit = MoeEngineFit {
            engine: "vllm".into(),
            rows: 4,
            shared: (0.6, 8.0),
            by_gpu: vec![
                (
                    ("h100-sxm", None, None),
                    MoeKernels {
                        gemm_eff: Some(1.0),
                        prefill_expert_us: None,
                        compute_eff: None,
                    },
                ),
                (
                    ("h200", None, None),
                    MoeKernels {
                        gemm_eff: Some(0.45),
                        prefill_expert_us: Some(12.0),
                        compute_eff: None,
                    },
                ),
                (
                    ("gb200", Some(ExpertFormat::Fp8), None),
                    MoeKernels {
                        gemm_eff: Some(0.3),
                        prefill_expert_us: None,
                        compute_eff: None,
                    },
                ),
                (
                    ("gb200", Some(ExpertFormat::Fp4), None),
                    MoeKernels {
                        gemm_eff: None,
                        prefill_expert_us: Some(18.0),
                        compute_eff: None,
                    },
                ),
                (
                    ("b200", None, None),
                    MoeKernels {
                        gemm_eff: None,
                        prefill_expert_us: Some(4.0),
                        compute_eff: Some(0.25),
                    },
                ),
            ],
            compute_offered: vec![],
            ttft_weight: 1.5,
            fold_ttft_weights: vec![1.0, 2.0],
            fold_fits: vec![
                vec![(
                    ("gb200", Some(ExpertFormat::Fp8), None),
                    MoeKernels {
                        gemm_eff: Some(0.45),
                        prefill_expert_us: Some(12.0),
                        compute_eff: None,
                    },
                )],
                vec![],
            ],
            fold_compute_offered: vec![vec![("gb200", ExpertFormat::Fp8, DS)], vec![]],
            held_out_ttft: vec![0.1, -0.2, 0.05, 0.3],
            held_out_tpot: vec![0.02, -0.1, 0.04, 0.0],
            held_out_rows: vec![(0, 0), (1, 0), (2, 1), (3, 1)],
            baseline_ttft: vec![0.2, -0.3, 0.1, 0.4],
            baseline_tpot: vec![0.3, -0.4, 0.2, 0.1],
            ids: (0..4).map(|i| format!("row{i}")).collect(),
        };
        let text = fit_toml(&fit, "silicon.csv", 2);
        // The offer the nested folds chose, the whole fit's and each fold's.
        assert!(
            text.contains("inside each GPU, format and shape's rows chose it: none ("),
            "{text}"
        );
        assert!(
            text.contains("inside its training rows: gb200 fp8 7168x2048 / none)"),
            "{text}"
        );
        let table: toml::Table = text.parse().expect("TOML");
        let cost: crate::cost_model::CostParams =
            toml::Value::Table(table["cost"].as_table().unwrap().clone())
                .try_into()
                .expect("[cost]");
        cost.validate().expect("valid");
        assert_eq!(cost.on_gpu("h200").moe_gemm_eff, 0.45);
        assert_eq!(cost.on_gpu("h200").moe_prefill_expert_us, 12.0);
        assert_eq!(cost.on_gpu("h100-sxm").moe_gemm_eff, 1.0);
        assert_eq!(
            cost.on_gpu("h100-sxm").moe_prefill_expert_us,
            cost.moe_prefill_expert_us
        );
        assert_eq!(cost.on_gpu("b200").moe_gemm_eff, cost.moe_gemm_eff);
        assert_eq!(cost.on_gpu("b200").moe_prefill_expert_us, 4.0);
        assert_eq!(cost.on_gpu("b200").moe_compute_eff, Some(0.25));
        assert_eq!(cost.on_gpu("h200").moe_compute_eff, None);
        // A GPU whose formats parted: each format its own, another the shared terms.
        assert_eq!(cost.on_gpu("gb200").moe_gemm_eff, cost.moe_gemm_eff);
        let gb200 = |d: Dtype| cost.on_deployment("gb200", d, Some(DS));
        assert_eq!(gb200(Dtype::Fp8Block).moe_gemm_eff, 0.3);
        assert_eq!(
            gb200(Dtype::Fp8Block).moe_prefill_expert_us,
            cost.moe_prefill_expert_us
        );
        assert_eq!(gb200(Dtype::Nvfp4).moe_gemm_eff, cost.moe_gemm_eff);
        assert_eq!(gb200(Dtype::Mxfp4).moe_prefill_expert_us, 18.0);
        assert_eq!(gb200(Dtype::Bf16), cost.on_gpu("gb200"));
        // A GPU's own terms hold for every format there.
        assert_eq!(
            cost.on_deployment("h200", Dtype::Fp8, Some(DS))
                .moe_gemm_eff,
            0.45
        );
        let record =
            crate::cost_model::calibration::uncertainty::FitRecord::from_file_table(&table)
                .expect("[fit]")
                .expect("present");
        assert_eq!(record.folds.len(), 2);
        let fold = toml::Value::Table(record.folds[0].clone())
            .try_into::<crate::cost_model::CostParams>()
            .expect("a fold is [cost] keys");
        assert_eq!(
            fold.on_deployment("gb200", Dtype::Fp8, None).moe_gemm_eff,
            0.45
        );
        assert_eq!(describe(&[], (0.6, 8.0)), "shared 0.6 / 8 us everywhere");
        assert_eq!(
            describe(&fit.by_gpu, fit.shared),
            "h100-sxm 1.00, h200 0.45 / 12 us, gb200 fp8 0.30, gb200 fp4 - / 18 us, b200 - / 4 us / compute 0.25"
        );
    }

    /// Every expert format feels a compute side, and a candidate offered only to
    /// dequantising kernels simulates again only the rows whose experts are dequantised
    /// (gpt-oss-120b's MXFP4 experts on a Hopper; not on a B200, with fp4 tensor cores, nor
    /// in fp8), which gives them the errors a full pass gives, the others infinite errors.
    #[test]
    fn a_dequantising_only_candidate_moves_only_dequantised_experts() {
        use super::{dequantised, offered, pass_moving, pass_with_lines, EngineCost};
        let mut rows = crate::observed::silicon::read(std::path::Path::new(
            "tests/data/observed/silicon-small.csv",
        ))
        .expect("rows");
        for (i, r) in rows.iter_mut().enumerate() {
            r.model = "openai/gpt-oss-120b".into();
            r.system = ["h100_sxm", "b200_sxm", "h200_sxm"][i % 3].into();
            r.gemm_quant = if i % 4 == 3 { "fp8" } else { "nvfp4" }.into();
        }
        let moving: Vec<bool> = rows.iter().map(dequantised).collect();
        assert!(moving.iter().any(|&m| m) && moving.iter().any(|&m| !m));
        for (r, m) in rows.iter().zip(&moving) {
            assert_eq!(
                *m,
                r.system != "b200_sxm" && r.gemm_quant == "nvfp4",
                "{}",
                r.id
            );
        }
        let shared = EngineCost::default();
        let (_, _, first, index) = pass_with_lines(&rows, &|_| shared).expect("pass");
        let slow = EngineCost {
            moe_compute_eff: Some(0.25),
            ..shared
        };
        let (_, _, full, _) = pass_with_lines(&rows, &|_| slow).expect("full pass");
        let moved = pass_moving(&rows, &dequantised, (&index, &first), &|_| slow).expect("spliced");
        // By the pass's row order, as the stage's offers see it.
        let mut moving_at = vec![false; moved.len()];
        for (r, &m) in rows.iter().zip(&moving) {
            if let Some(&i) = index.get(&r.line) {
                moving_at[i] = m;
            }
        }
        let spliced = offered(&[moved], &moving_at, |_| false).remove(0);
        let mut felt = 0;
        for (r, m) in rows.iter().zip(&moving) {
            let Some(&i) = index.get(&r.line) else {
                continue;
            };
            if *m {
                assert_eq!(spliced[i], full[i], "{}", r.id);
            } else {
                assert_eq!(spliced[i], (f64::INFINITY, f64::INFINITY), "{}", r.id);
            }
            // Every format's prefill slows under a quarter of the compute.
            assert!(full[i].0 > first[i].0, "{}", r.id);
            felt += 1;
        }
        assert!(felt > 0);
    }

    /// Offered only where the kernel dequantises, a candidate with a compute side keeps its
    /// errors on the rows that dequantise and is out of reach (infinite errors) on the
    /// others; a candidate without one is untouched.
    #[test]
    fn a_compute_side_offered_only_to_dequantising_rows() {
        let by: Vec<Errors> = (0..CANDIDATES)
            .map(|c| vec![(c as f64, -(c as f64)), (0.5, 0.5)])
            .collect();
        let moving = [true, false];
        let offer = only_dequantising(&by, &moving);
        for c in 0..CANDIDATES {
            assert_eq!(offer[c][0], by[c][0], "{c}");
            if candidate(c).2.is_some() {
                assert_eq!(offer[c][1], (f64::INFINITY, f64::INFINITY), "{c}");
            } else {
                assert_eq!(offer[c][1], by[c][1], "{c}");
            }
        }
    }

    /// The inner k-fold keeps the smaller offer on a tie and takes the larger one where it
    /// holds out better: a compute side that helps every row of a GPU and format is taken,
    /// one that hurts every row is not.
    #[test]
    fn the_inner_folds_choose_the_offer_that_holds_out() {
        use crate::cost_model::ExpertFormat::Fp8;
        let n = 20;
        let gpus: Vec<Group> = vec![("h200", Fp8, DS); n];
        let train: Vec<usize> = (0..n).collect();
        let (with_compute, base, mut by) = rising_errors(n);
        let plain = only_dequantising(&by, &vec![false; n]);
        // Nothing to gain: the smaller offer.
        assert_eq!(
            nested_choice(&[plain.clone(), by.clone()], &gpus, &train, 5),
            0
        );
        // A compute side that halves every row's TTFT error holds out better.
        by[with_compute] = base.iter().map(|e| (e.0 / 2.0, e.1)).collect();
        let plain = only_dequantising(&by, &vec![false; n]);
        assert_eq!(nested_choice(&[plain, by.clone()], &gpus, &train, 5), 1);
        // One that is worse on every row is not taken, whatever the offer.
        by[with_compute] = base.iter().map(|e| (e.0 * 2.0, e.1)).collect();
        let plain = only_dequantising(&by, &vec![false; n]);
        assert_eq!(nested_choice(&[plain, by], &gpus, &train, 5), 0);
    }

    /// The candidates are every triple of the three lists, each once, the shared one first.
    #[test]
    fn the_candidates_are_every_triple_once() {
        use super::{EXTRA_CANDIDATES, PRODUCT};
        assert_eq!(candidate(0), (None, None, None));
        // A compute candidate of the product splices onto the same pair without it.
        let pairs = super::GEMM_CANDIDATES.len() * super::PREFILL_CANDIDATES.len();
        for c in pairs..PRODUCT {
            let ((g, p, compute), (bg, bp, bc)) = (candidate(c), candidate(c % pairs));
            assert_eq!((g, p, bc), (bg, bp, None), "{c}");
            assert!(compute.is_some(), "{c}");
        }
        for (i, &extra) in EXTRA_CANDIDATES.iter().enumerate() {
            assert_eq!(candidate(PRODUCT + i), extra);
        }
        let mut seen: Vec<(Option<f64>, Option<f64>, Option<f64>)> =
            (0..CANDIDATES).map(candidate).collect();
        let n = seen.len();
        seen.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
        seen.dedup();
        assert_eq!(seen.len(), n, "every triple once");
        assert_eq!(
            n,
            super::GEMM_CANDIDATES.len()
                * super::PREFILL_CANDIDATES.len()
                * super::COMPUTE_CANDIDATES.len()
                + EXTRA_CANDIDATES.len()
        );
    }

    /// A passes file is read back exactly, simulated again when it was kept for other rows
    /// or terms (its header differs), and a bad line is named.
    #[test]
    fn a_passes_file_is_read_back_or_refused_by_line() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("calibration/serving/aiconfigurator/silicon.csv");
        let rows = crate::observed::silicon::read(&path).expect("silicon.csv");
        let mine: Vec<_> = rows.into_iter().filter(|r| r.is_moe()).take(3).collect();
        let prior = crate::cost_model::validation::silicon::EngineCost::default();
        let header = passes_header(&mine, &prior);
        let line = |id: &str, gpu: &str, x: f64| {
            let mut cells = vec![id.to_string(), gpu.to_string()];
            for c in 0..CANDIDATES {
                cells.push((x + c as f64 / 1000.0).to_string());
                cells.push((-x).to_string());
            }
            cells.join(",")
        };
        let good = format!(
            "{header}\n{}\n{}\n# 2 rows\n",
            line(&mine[0].id, "h200", 0.1),
            line(&mine[1].id, "b200", 1.0 / 3.0)
        );
        let (ids, gpus, by) = read_passes(&good, &header, &mine)
            .expect("same header")
            .expect("good lines");
        assert_eq!(ids, [mine[0].id.clone(), mine[1].id.clone()]);
        assert_eq!(gpus, ["h200", "b200"]);
        assert_eq!(by.len(), CANDIDATES);
        assert_eq!(by[2][1], (1.0 / 3.0 + 0.002, -1.0 / 3.0));
        // Cut short at a line's end, or without its closing line.
        let short = good.replace("# 2 rows\n", "");
        let e = read_passes(&short, &header, &mine)
            .expect("same header")
            .expect_err("no closing line");
        assert!(e.starts_with("line 4: expected `# 2 rows`"), "{e}");
        let cut = format!("{header}\n{}\n# 2 rows\n", line(&mine[0].id, "h200", 0.1));
        let e = read_passes(&cut, &header, &mine)
            .expect("same header")
            .expect_err("a row missing");
        assert!(e.contains("expected `# 1 rows`"), "{e}");
        let none = read_passes(&format!("{header}\n# 0 rows\n"), &header, &mine)
            .expect("same header")
            .expect("no rows, but whole");
        assert!(none.0.is_empty());
        // Kept over other rows (or another prior, or other candidates): simulate again.
        let fewer = passes_header(&mine[..2], &prior);
        assert!(read_passes(&good, &fewer, &mine[..2]).is_none());
        let e = read_passes(&format!("{header}\nx,h200,1\n"), &header, &mine)
            .expect("same header")
            .expect_err("short line");
        assert!(e.starts_with("line 2: expected"), "{e}");
        let e = read_passes(
            &format!("{header}\n{}\n", line("nope", "h200", 0.0)),
            &header,
            &mine,
        )
        .expect("same header")
        .expect_err("unknown row");
        assert!(e.contains("line 2") && e.contains("`nope`"), "{e}");
        let twice = format!("{header}\n{0}\n{0}\n", line(&mine[0].id, "h200", 0.0));
        let e = read_passes(&twice, &header, &mine)
            .expect("same header")
            .expect_err("a row twice");
        assert!(
            e.starts_with("line 3:") && e.contains("a second time"),
            "{e}"
        );
        let bad = line(&mine[0].id, "h200", 0.0).replacen("0.001", "abc", 1);
        let e = read_passes(&format!("{header}\n{bad}\n"), &header, &mine)
            .expect("same header")
            .expect_err("not a number");
        assert!(e.contains("`abc` is not a number"), "{e}");
    }

    /// Each GPU and format decides its own offer on its own rows: a compute side that helps
    /// one group's rows is offered there and not to a group it would not help, and the rows
    /// of each then carry their own offer's errors.
    #[test]
    fn each_gpu_and_format_decides_its_own_offer() {
        use crate::cost_model::ExpertFormat::{Fp4, Fp8};
        let n = 40;
        let gpus: Vec<Group> = (0..n)
            .map(|i| {
                if i % 2 == 0 {
                    ("h200", Fp8, DS)
                } else {
                    ("b200", Fp4, OSS)
                }
            })
            .collect();
        let train: Vec<usize> = (0..n).collect();
        let (with_compute, base, mut by) = rising_errors(n);
        // Halves the TTFT error of the H200 rows, doubles the B200 rows'.
        by[with_compute] = base
            .iter()
            .zip(&gpus)
            .map(|(e, g)| {
                if g.0 == "h200" {
                    (e.0 / 2.0, e.1)
                } else {
                    (e.0 * 2.0, e.1)
                }
            })
            .collect();
        let variants = [only_dequantising(&by, &vec![false; n]), by.clone()];
        let larger = nested_offer(&variants, &gpus, &train, 5);
        assert_eq!(larger, [("h200", Fp8, DS)]);
        let errors = under_offers(&variants, &gpus, &larger);
        assert_eq!(errors[with_compute][0], by[with_compute][0]);
        assert!(errors[with_compute][1].0.is_infinite());
        // A group with fewer rows than folds keeps the smaller offer.
        assert!(nested_offer(&variants, &gpus, &[0, 2, 4], 5).is_empty());
    }

    /// `n` rows whose TTFT errors rise from 20% by a point a row, under every candidate alike,
    /// and the candidate of a compute side at half a dense GEMM's (offered to every format,
    /// not the dequantising-only quarter): `(that candidate, the errors, every candidate's)`.
    fn rising_errors(n: usize) -> (usize, Errors, Vec<Errors>) {
        let with_compute = (0..CANDIDATES)
            .find(|&c| candidate(c).2 == Some(0.5))
            .expect("a compute side of 0.5");
        let base: Errors = (0..n).map(|i| (0.2 + 0.01 * i as f64, 0.1)).collect();
        let by = vec![base.clone(); CANDIDATES];
        (with_compute, base, by)
    }
}
