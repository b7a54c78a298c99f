//! Kernel efficiencies fitted to aiconfigurator's measured deployments, with k-fold
//! held-out errors (part of `sim calibrate --observed`): one value per [`Term`], over every
//! engine's rows that the term touches.
//!
//! - `cost.allreduce_peer_us` ([`Term::AllreducePeer`]): a one-shot all-reduce (the
//!   engines' custom kernel for a decode step's small messages) reads every peer's buffer
//!   and waits on every peer's flag, so its fixed cost grows with the GPUs beyond a pair:
//!   under a flat latency the dense models' TPOT was 15-28% short at TP8 and within a few
//!   percent at TP2, on every engine and GPU. Fitted first, to the dense models' rows above
//!   TP2 (the only ones it moves).
//! - `cost.fp8_memory_eff` ([`Term::Fp8Memory`]): fp8 GEMMs at a decode step's few rows
//!   stream their weights further from the bandwidth roof than 16-bit ones (small-batch
//!   decodes of fp8 models run slower than their weight bytes at `gemm_memory_eff`).
//!   Fitted first, to the dense models' fp8 rows; the compute efficiency is then refitted
//!   with it in place.
//! - `cost.fp8_compute_eff` ([`Term::Fp8`]): fp8 GEMMs reach a smaller fraction of the fp8
//!   tensor-core peak than 16-bit GEMMs reach of theirs (scales applied per tensor or per
//!   block, narrower tiles, activations quantized on the fly), so the 16-bit efficiency makes
//!   fp8 deployments too fast. Fitted to the dense models' fp8 rows.
//! - `cost.fp4_memory_eff` ([`Term::Fp4Memory`]) and `cost.fp4_compute_eff`
//!   ([`Term::Fp4`]): the same for NVFP4 GEMMs on Blackwell's fp4 tensor cores. Fitted in
//!   that order to the dense models' NVFP4 rows.
//! - `cost.moe_gemm_eff` ([`Term::Moe`]): a mixture of experts' grouped GEMMs run a few
//!   tokens per expert, gathered and scattered, below a dense GEMM's efficiency. Fitted to
//!   the mixture-of-experts rows (with the fp8 fit in place).
//! - `cost.moe_prefill_expert_us` ([`Term::MoePrefill`]): a fixed cost per expert of the
//!   model and MoE layer in a step that prefills (each expert's GEMM a problem of its own,
//!   outside the decode steps' CUDA graphs; under expert parallelism each rank waits for
//!   the others' at every dispatch and combine, so the floor does not shrink). Fitted to the mixture-of-experts rows with the
//!   grouped-GEMM fit in place.
//! - `cost.moe_layer_us` ([`Term::MoeLayer`]): a fixed cost per MoE layer of every step
//!   (the router's top-k, sorting and permuting tokens): small-batch decodes of mixtures of
//!   experts run slower than their weight reads.
//! - `cost.moe_routing_skew` ([`Term::MoeSkew`]): how unevenly the routers spread tokens
//!   over the experts (fewer distinct experts read per decode step). Fitted to the
//!   mixture-of-experts rows with the two fits above in place.
//! - The acceptance of multi-token-prediction drafts ([`Term::MtpAcceptance`]) in the
//!   InferenceX rows measured with speculative decoding, which record neither it nor a
//!   dataset it could be measured on (random tokens): fitted to those rows, the value
//!   `sim validate-model` simulates them with
//!   ([`crate::cost_model::validation::silicon::MTP_ACCEPTANCE`]), not a `[cost]` default.
//!
//! Each is a property of the kernels, not of one engine. Every row is simulated under each
//! candidate, under its engine's serving defaults; per fold the candidate with the smallest
//! sum of the median absolute TTFT and TPOT errors on the other folds is chosen, and the
//! held-out fold's errors under it are kept. In: aiconfigurator's rows; out: an
//! [`EfficiencyFit`] and its file, whose value the shipped default
//! ([`crate::cost_model::CostParams`]) is.

use std::fmt::Write as _;

use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::observed::{median_abs, p90_abs};
use crate::cost_model::validation::silicon::{silicon_checks_with, EngineCost};
use crate::observed::silicon::AggregateRow;

/// The one-shot all-reduce's costs per GPU beyond a pair tried, microseconds.
pub const ALLREDUCE_PEER_CANDIDATES: [f64; 9] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0];

/// The fp8 efficiencies tried, relative to the 16-bit GEMMs'.
pub const FP8_CANDIDATES: [f64; 7] = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4];

/// The fp8 weight-streaming efficiencies tried, relative to the 16-bit GEMMs'.
pub const FP8_MEMORY_CANDIDATES: [f64; 10] = [1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.5];

/// The fp4 weight-streaming efficiencies tried, relative to the 16-bit GEMMs'.
pub const FP4_MEMORY_CANDIDATES: [f64; 12] = [
    1.0, 0.9, 0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5, 0.45, 0.4, 0.35,
];

/// The fp4 efficiencies tried, relative to the 16-bit GEMMs'.
pub const FP4_CANDIDATES: [f64; 9] = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.25];

/// The grouped-GEMM efficiencies tried, relative to dense GEMMs' (lower: at a few tokens per
/// expert the grouped kernels stream weights far below a dense GEMM's rate).
pub const MOE_CANDIDATES: [f64; 9] = [1.0, 0.8, 0.6, 0.5, 0.4, 0.35, 0.3, 0.25, 0.2];

/// The per-expert prefill costs tried, microseconds.
pub const MOE_PREFILL_CANDIDATES: [f64; 8] = [0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 15.0];

/// The fixed costs per MoE layer and step tried, microseconds.
pub const MOE_LAYER_CANDIDATES: [f64; 7] = [0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 70.0];

/// The routing skews tried (Zipf exponents; 0: uniform routing).
pub const MOE_SKEW_CANDIDATES: [f64; 6] = [0.0, 0.25, 0.5, 0.75, 1.0, 1.5];

/// The draft acceptance rates tried (0: the rows simulated without speculative decoding).
pub const MTP_ACCEPTANCE_CANDIDATES: [f64; 8] = [0.0, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9];

/// A fitted efficiency (or, for [`Term::MoePrefill`], a cost; for [`Term::MoeSkew`], a
/// routing skew).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Term {
    /// `cost.allreduce_peer_us`, on dense models' rows above TP2.
    AllreducePeer,
    /// `cost.fp8_memory_eff`, on dense models' fp8 rows.
    Fp8Memory,
    /// `cost.fp8_compute_eff`, on dense models' fp8 rows.
    Fp8,
    /// `cost.fp4_memory_eff`, on dense models' NVFP4 rows.
    Fp4Memory,
    /// `cost.fp4_compute_eff`, on dense models' NVFP4 rows.
    Fp4,
    /// `cost.moe_gemm_eff`, on mixtures of experts' rows.
    Moe,
    /// `cost.moe_prefill_expert_us`, on mixtures of experts' rows.
    MoePrefill,
    /// `cost.moe_layer_us`, on mixtures of experts' rows.
    MoeLayer,
    /// `cost.moe_routing_skew`, on mixtures of experts' rows.
    MoeSkew,
    /// The acceptance of multi-token-prediction drafts, on the rows measured with them.
    MtpAcceptance,
}

impl Term {
    /// The values tried.
    pub fn candidates(self) -> &'static [f64] {
        match self {
            Term::AllreducePeer => &ALLREDUCE_PEER_CANDIDATES,
            Term::Fp8Memory => &FP8_MEMORY_CANDIDATES,
            Term::Fp8 => &FP8_CANDIDATES,
            Term::Fp4Memory => &FP4_MEMORY_CANDIDATES,
            Term::Fp4 => &FP4_CANDIDATES,
            Term::Moe => &MOE_CANDIDATES,
            Term::MoePrefill => &MOE_PREFILL_CANDIDATES,
            Term::MoeLayer => &MOE_LAYER_CANDIDATES,
            Term::MoeSkew => &MOE_SKEW_CANDIDATES,
            Term::MtpAcceptance => &MTP_ACCEPTANCE_CANDIDATES,
        }
    }

    /// The key (under `[cost]`; `[speculative]` for [`Term::MtpAcceptance`]).
    pub fn key(self) -> &'static str {
        match self {
            Term::AllreducePeer => "allreduce_peer_us",
            Term::Fp8Memory => "fp8_memory_eff",
            Term::Fp8 => "fp8_compute_eff",
            Term::Fp4Memory => "fp4_memory_eff",
            Term::Fp4 => "fp4_compute_eff",
            Term::Moe => "moe_gemm_eff",
            Term::MoePrefill => "moe_prefill_expert_us",
            Term::MoeLayer => "moe_layer_us",
            Term::MoeSkew => "moe_routing_skew",
            Term::MtpAcceptance => "acceptance",
        }
    }

    /// The file `sim calibrate --observed` writes.
    pub fn file(self) -> &'static str {
        match self {
            Term::AllreducePeer => "allreduce-peer.toml",
            Term::Fp8Memory => "fp8-memory.toml",
            Term::Fp8 => "fp8-gemm.toml",
            Term::Fp4Memory => "fp4-memory.toml",
            Term::Fp4 => "fp4-gemm.toml",
            Term::Moe => "moe-gemm.toml",
            Term::MoePrefill => "moe-prefill.toml",
            Term::MoeLayer => "moe-layer.toml",
            Term::MoeSkew => "moe-skew.toml",
            Term::MtpAcceptance => "mtp-acceptance.toml",
        }
    }

    /// What the value is, for the file's header.
    fn what(self) -> &'static str {
        match self {
            Term::AllreducePeer => "The one-shot all-reduce's fixed cost per GPU beyond a pair, microseconds",
            Term::Fp8Memory => "The fp8 GEMMs' weight-streaming efficiency relative to gemm_memory_eff",
            Term::Fp8 => "The fp8 GEMM efficiency relative to gemm_compute_eff",
            Term::Fp4Memory => "The fp4 (NVFP4) GEMMs' weight-streaming efficiency relative to gemm_memory_eff",
            Term::Fp4 => "The fp4 (NVFP4) GEMM efficiency relative to gemm_compute_eff",
            Term::Moe => "The mixture of experts' grouped-GEMM efficiency relative to dense GEMMs'",
            Term::MoePrefill => "The fixed cost per expert of the model and MoE layer of a step that prefills, microseconds",
            Term::MoeLayer => "The fixed cost per MoE layer of every step (routing, sorting and permuting tokens), microseconds",
            Term::MoeSkew => "The routers' expert popularity skew (Zipf exponent; 0: uniform routing)",
            Term::MtpAcceptance => "The acceptance rate of each multi-token-prediction draft given the ones before it, in the InferenceX rows measured with speculative decoding",
        }
    }

    /// The rows the term is fitted to.
    fn applies(self, r: &AggregateRow) -> bool {
        match self {
            Term::AllreducePeer => !r.is_moe() && r.tp.unwrap_or(1) > 2,
            Term::Fp8 | Term::Fp8Memory => {
                !r.is_moe() && matches!(r.gemm_quant.as_str(), "fp8" | "fp8_block")
            }
            Term::Fp4 | Term::Fp4Memory => !r.is_moe() && r.gemm_quant == "nvfp4",
            Term::Moe | Term::MoePrefill | Term::MoeLayer | Term::MoeSkew => r.is_moe(),
            Term::MtpAcceptance => r.mtp_drafts.is_some(),
        }
    }

    /// The rows' costs with the term at `eff`, the terms fitted before it at `prior`: what
    /// the next term is fitted under once this one is.
    pub fn cost(self, eff: f64, prior: &EngineCost) -> EngineCost {
        let mut c = *prior;
        match self {
            Term::AllreducePeer => c.allreduce_peer_us = Some(eff),
            Term::Fp8Memory => c.fp8_memory_eff = Some(eff),
            Term::Fp8 => c.fp8_compute_eff = Some(eff),
            Term::Fp4Memory => c.fp4_memory_eff = Some(eff),
            Term::Fp4 => c.fp4_compute_eff = Some(eff),
            Term::Moe => c.moe_gemm_eff = Some(eff),
            Term::MoePrefill => c.moe_prefill_expert_us = Some(eff),
            Term::MoeLayer => c.moe_layer_us = Some(eff),
            Term::MoeSkew => c.moe_routing_skew = Some(eff),
            Term::MtpAcceptance => c.mtp_acceptance = Some(eff),
        }
        c
    }
}

/// The fit of one efficiency.
#[derive(Debug, Clone, PartialEq)]
pub struct EfficiencyFit {
    /// The term fitted.
    pub term: Term,
    /// Its candidates' k-fold choice and errors.
    pub fit: Folded,
}

/// Fits `term` to the rows of `rows` it applies to, `folds`-fold, with the terms fitted
/// before it at `prior` (`None`s: the defaults). `None` when fewer rows than folds can be
/// simulated.
pub fn fit_efficiency(
    rows: &[AggregateRow],
    folds: usize,
    term: Term,
    prior: &EngineCost,
) -> Result<Option<EfficiencyFit>, crate::SimError> {
    let folds = folds.max(2);
    let mine: Vec<AggregateRow> = rows.iter().filter(|r| term.applies(r)).cloned().collect();
    // (TTFT, TPOT) errors of every simulated row under each candidate.
    // A row may be simulated under one candidate and not another (the acceptance's 0 is
    // another deployment: no drafts, other budgets), so rows are matched by id and only
    // those every candidate simulated are compared.
    let mut by_candidate: Vec<std::collections::HashMap<String, (f64, f64)>> = Vec::new();
    let candidates = term.candidates();
    for &eff in candidates {
        let (done, _) = silicon_checks_with(&mine, None, &|_, _| term.cost(eff, prior))?;
        by_candidate.push(
            done.iter()
                .map(|k| (k.row.id.clone(), (k.ttft_error(), k.tpot_error())))
                .collect(),
        );
    }
    let ids: Vec<&String> = mine
        .iter()
        .map(|r| &r.id)
        .filter(|id| by_candidate.iter().all(|m| m.contains_key(*id)))
        .collect();
    let errors: Vec<Vec<(f64, f64)>> = by_candidate
        .iter()
        .map(|m| ids.iter().map(|id| m[*id]).collect())
        .collect();
    let n = ids.len();
    if n < folds {
        return Ok(None);
    }
    Ok(Some(EfficiencyFit {
        term,
        fit: folded(candidates, &errors, folds),
    }))
}

/// A k-fold choice among candidates and the errors it leaves.
#[derive(Debug, Clone, PartialEq)]
pub struct Folded {
    /// Rows simulated under every candidate.
    pub rows: usize,
    /// The value chosen on every row.
    pub value: f64,
    /// Each fold's value.
    pub fold_values: Vec<f64>,
    /// Held-out signed TTFT errors (one per row, fold by fold).
    pub held_out_ttft: Vec<f64>,
    /// See `held_out_ttft`.
    pub held_out_tpot: Vec<f64>,
    /// Errors at the first candidate (the baseline: 1 for an efficiency, 0 for a cost).
    pub baseline_ttft: Vec<f64>,
    /// See `baseline_ttft`.
    pub baseline_tpot: Vec<f64>,
    /// Each candidate with its median |TTFT| and |TPOT| errors over every row (in-sample:
    /// the shape of the fit, not its held-out error).
    pub landscape: Vec<(f64, f64, f64)>,
}

impl Folded {
    /// The landscape as text: `value: TTFT% / TPOT%`, comma-separated.
    pub fn landscape_text(&self) -> String {
        let shape: Vec<String> = self
            .landscape
            .iter()
            .map(|(v, ttft, tpot)| format!("{v}: {:.1}% / {:.1}%", 100.0 * ttft, 100.0 * tpot))
            .collect();
        shape.join(", ")
    }
}

/// Chooses among `candidates` `folds`-fold: per fold, the candidate with the smallest sum
/// of the median |TTFT| and |TPOT| errors on the other folds, scored on the held-out one.
/// `errors[c][i]` is row `i`'s (TTFT, TPOT) error under candidate `c`. The rows are
/// shuffled with a fixed seed first (the engines' fits' too), so folds mix GPUs, models
/// and loads.
pub(crate) fn folded(candidates: &[f64], errors: &[Vec<(f64, f64)>], folds: usize) -> Folded {
    let n = errors.first().map_or(0, Vec::len);
    let score = |c: usize, on: &[usize]| {
        let ttft: Vec<f64> = on.iter().map(|&i| errors[c][i].0).collect();
        let tpot: Vec<f64> = on.iter().map(|&i| errors[c][i].1).collect();
        median_abs(&ttft) + median_abs(&tpot)
    };
    let best = |on: &[usize]| {
        (0..errors.len())
            .min_by(|&a, &b| score(a, on).total_cmp(&score(b, on)))
            .unwrap_or(0)
    };
    let mut idx: Vec<usize> = (0..n).collect();
    idx.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(17));
    let (baseline_ttft, baseline_tpot) = errors[0].iter().copied().unzip();
    let mut fit = Folded {
        rows: n,
        value: candidates[best(&idx)],
        fold_values: Vec::new(),
        held_out_ttft: Vec::new(),
        held_out_tpot: Vec::new(),
        baseline_ttft,
        baseline_tpot,
        landscape: candidates
            .iter()
            .zip(errors)
            .map(|(&v, e)| {
                let (ttft, tpot): (Vec<f64>, Vec<f64>) = e.iter().copied().unzip();
                (v, median_abs(&ttft), median_abs(&tpot))
            })
            .collect(),
    };
    for f in 0..folds {
        let train: Vec<usize> = (0..n).filter(|j| j % folds != f).map(|j| idx[j]).collect();
        let c = best(&train);
        fit.fold_values.push(candidates[c]);
        for j in (f..n).step_by(folds) {
            fit.held_out_ttft.push(errors[c][idx[j]].0);
            fit.held_out_tpot.push(errors[c][idx[j]].1);
        }
    }
    fit
}

impl EfficiencyFit {
    /// One line: the value, its folds and the held-out errors against the baseline.
    pub fn summary(&self, folds: usize) -> String {
        let folds_list: Vec<String> = self
            .fit
            .fold_values
            .iter()
            .map(|v| format!("{v}"))
            .collect();
        let base = match self.term {
            Term::MtpAcceptance => "without speculative decoding".to_string(),
            t => format!("at {}", t.candidates()[0]),
        };
        let rows = match self.term {
            Term::AllreducePeer => "rows of dense models above TP2",
            Term::Fp8 | Term::Fp8Memory => "fp8 rows of dense models",
            Term::Fp4 | Term::Fp4Memory => "NVFP4 rows of dense models",
            Term::Moe | Term::MoePrefill | Term::MoeLayer | Term::MoeSkew => {
                "mixture-of-experts rows"
            }
            Term::MtpAcceptance => "rows measured with multi-token prediction",
        };
        format!(
            "{} = {} fitted to {} {rows} of every engine; {folds}-fold held-out: TTFT median |err| {:.1}%, p90 {:.1}% ({base}: {:.1}%, {:.1}%), TPOT median |err| {:.1}%, p90 {:.1}% ({base}: {:.1}%, {:.1}%); the folds' values: {}",
            self.term.key(),
            self.fit.value,
            self.fit.rows,
            100.0 * median_abs(&self.fit.held_out_ttft),
            100.0 * p90_abs(&self.fit.held_out_ttft),
            100.0 * median_abs(&self.fit.baseline_ttft),
            100.0 * p90_abs(&self.fit.baseline_ttft),
            100.0 * median_abs(&self.fit.held_out_tpot),
            100.0 * p90_abs(&self.fit.held_out_tpot),
            100.0 * median_abs(&self.fit.baseline_tpot),
            100.0 * p90_abs(&self.fit.baseline_tpot),
            folds_list.join(", ")
        )
    }

    /// The calibration file: the value under `[cost]`, what it was fitted to in the header.
    pub fn toml(&self, source: &str, folds: usize) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# {}, fitted by `sim calibrate --observed {source}`.",
            self.term.what()
        );
        let _ = writeln!(s, "# {}.", self.summary(folds));
        let _ = writeln!(
            s,
            "# Median |err| of TTFT / TPOT over every row at each value tried: {}.",
            self.fit.landscape_text()
        );
        if self.term == Term::MtpAcceptance {
            let _ = writeln!(
                s,
                "# `sim validate-model` simulates those rows with this value (a test ties them); a scenario may use the table with `k` set to the drafts its engine runs."
            );
            if self.fit.value > 0.0 {
                let _ = writeln!(
                    s,
                    "[speculative]\nmethod = \"mtp\"\n{} = [{:?}]",
                    self.term.key(),
                    self.fit.value
                );
            } else {
                // 0 is the rows simulated without speculative decoding.
                let _ = writeln!(s, "[speculative]\nmethod = \"none\"");
            }
            return s;
        }
        let _ = writeln!(
            s,
            "# The shipped default of `cost.{}` is this value (a test ties them).",
            self.term.key()
        );
        let _ = writeln!(s, "[cost]\n{} = {:?}", self.term.key(), self.fit.value);
        s
    }
}
