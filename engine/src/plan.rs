//! What the scheduler hands the worker (`StepPlan`) and what comes back (`StepOutcome`).

use crate::request::{Nanos, SeqId};

/// The kind of work one sequence does in a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkKind {
    /// Compute the KV of prompt tokens `[start, start + len)` (a whole prompt or a chunk; also
    /// the recompute of a preempted sequence).
    Prefill,
    /// Generate one token after the last one.
    Decode,
    /// Speculative decoding: compute the last token and `k` drafts ([`SeqWork::drafts`];
    /// `len = 1 + k`), accept the drafts the model agrees with and add one token.
    Verify,
}

/// One sequence's share of a step.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqWork {
    /// Sequence id.
    pub seq: SeqId,
    /// Prefill chunk or decode.
    pub kind: WorkKind,
    /// First token position computed in this step (= tokens already in the KV cache).
    pub start: u32,
    /// Number of tokens computed in this step.
    pub len: u32,
    /// Whether the step ends at the sequence's last token, so a token is sampled.
    pub sample: bool,
    /// Tokens sampled from that last position when `sample`: 1, or `n` when a
    /// parallel-sampling request finishes its prompt (its `n` sequences fork there).
    pub num_samples: u32,
    /// Block table after this step's reservation (filled only when the backend asks for
    /// it: real runtimes need it, the cost model does not).
    pub block_table: Vec<u32>,
    /// Input token ids of positions `[start, start + len)` (filled only for real backends;
    /// empty when the prompt carries no ids, e.g. synthetic workloads).
    pub token_ids: Vec<u32>,
    /// How the sampled tokens are drawn (the request's parameters).
    pub sampling: crate::request::SamplingParams,
    /// The drafts of a [`WorkKind::Verify`] (`None` otherwise).
    pub drafts: Option<crate::spec::Drafts>,
    /// Token ids the draws of this step's first [`SeqWork::suppress_rows`] sampled
    /// positions must not pick (their logits are masked): end-of-sequence and the stop
    /// token ids while the request is short of its `min_tokens`. Empty almost always.
    pub suppress: Vec<u32>,
    /// Sampled positions, in order, whose draws mask [`SeqWork::suppress`]: all `n` draws
    /// of a decode or a prompt's end count as one position; a verify's rows one each.
    pub suppress_rows: u32,
}

impl SeqWork {
    /// Context length after this step (tokens attended to by the last computed token).
    pub fn context_len(&self) -> u32 {
        self.start + self.len
    }
}

/// One engine step: the batch the worker executes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepPlan {
    /// Step number.
    pub step: u64,
    /// Time the step starts.
    pub start: Nanos,
    /// Work per sequence, in scheduling order.
    pub work: Vec<SeqWork>,
    /// Sequences preempted while this step was scheduled (their KV was freed).
    pub preempted: Vec<SeqId>,
    /// Block copies `(src, dst)` to perform before the step (copy-on-write), after the
    /// swap-outs and before the swap-ins.
    pub block_copies: Vec<(u32, u32)>,
    /// Blocks to copy from the CPU pool before the step, as `(cpu block, gpu block)`, last
    /// (after the swap-outs and the block copies).
    pub swap_in: Vec<(u32, u32)>,
    /// Blocks loaded from the CPU offload tier into fresh GPU blocks before the step (the
    /// sequences' prefix hits there), over PCIe like swap-ins.
    pub offload_loads: u32,
    /// Of those, the blocks read from the disk tier first (then over PCIe).
    pub disk_loads: u32,
    /// Blocks to copy to the CPU pool first, before anything of the step reuses the GPU
    /// blocks they free, as `(gpu block, cpu block)`. A block shared by two preempted
    /// sequences is copied once for each.
    pub swap_out: Vec<(u32, u32)>,
    /// Work a padded static batch computes for nothing (Hugging Face `generate` serving a
    /// batch): empty unless `engine.static_padding`. The cost model prices it; real
    /// runtimes skip it (their batches are not padded).
    pub padding: Padding,
    /// Tokens the step's attention-DP group computes in all, every rank's together (their
    /// MoE layers meet in the experts): set by the driver when the ranks are simulated as
    /// engines of their own; `None`: every rank as loaded as this one (one rank simulated).
    pub moe_group_tokens: Option<u32>,
}

/// The padding of a static batch whose prompts are padded to the longest and whose
/// finished members keep decoding pad tokens until the last member ends.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Padding {
    /// Pad tokens computed with a prefill, as `(first position, tokens)`: a prompt padded
    /// to the batch's longest.
    pub prefill: Vec<(u32, u32)>,
    /// Decode rows of finished members, each at the context it attends to (the batch's
    /// longest, as left padding makes every row as long).
    pub decode: Vec<u32>,
    /// In a decode step, the padded context every row of the batch attends to and holds in
    /// its cache (the longest prompt plus the decode steps run, under left padding); 0 in
    /// other steps. Live rows are priced at it too, and the batch's cache is concatenated
    /// at it (Hugging Face's default attention runs over the padded tensor, and its
    /// `DynamicCache` appends each step's keys and values by copying the layer's cache).
    pub context: u32,
}

impl Padding {
    /// True when the step computes no padding.
    pub fn is_empty(&self) -> bool {
        self.prefill.is_empty() && self.decode.is_empty() && self.context == 0
    }

    /// Tokens of padding the step computes.
    pub fn tokens(&self) -> u64 {
        self.prefill.iter().map(|&(_, n)| u64::from(n)).sum::<u64>() + self.decode.len() as u64
    }
}

impl StepPlan {
    /// Total tokens computed in the step.
    pub fn num_batched_tokens(&self) -> u32 {
        self.work.iter().map(|w| w.len).sum()
    }

    /// Prefill tokens in the step.
    pub fn num_prefill_tokens(&self) -> u32 {
        self.work
            .iter()
            .filter(|w| w.kind == WorkKind::Prefill)
            .map(|w| w.len)
            .sum()
    }

    /// Tokens the backend samples for this plan's prefill and decode work (verify work
    /// adds `accepted + 1` each: [`StepOutcome::expected_samples`]).
    pub fn num_samples(&self) -> usize {
        self.work
            .iter()
            .filter(|w| w.sample && w.kind != WorkKind::Verify)
            .map(|w| w.num_samples as usize)
            .sum()
    }

    /// Verify work items (speculative decoding) in the plan.
    pub fn num_verify(&self) -> usize {
        self.work
            .iter()
            .filter(|w| w.kind == WorkKind::Verify)
            .count()
    }

    /// Positions whose logits the step needs: each sampling work's last token, and every
    /// position of a verify work (the target's distribution at each draft).
    pub fn num_logit_rows(&self) -> usize {
        self.work
            .iter()
            .map(|w| match w.kind {
                WorkKind::Verify => w.len as usize,
                _ => usize::from(w.sample),
            })
            .sum()
    }

    /// True when the plan moves KV blocks (swaps or copies) before its work.
    pub fn has_transfers(&self) -> bool {
        !self.swap_in.is_empty()
            || !self.swap_out.is_empty()
            || !self.block_copies.is_empty()
            || self.offload_loads > 0
    }

    /// True when the step has no work.
    pub fn is_empty(&self) -> bool {
        self.work.is_empty()
    }
}

/// What a backend returns for a step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepOutcome {
    /// Duration of the step: predicted by a cost model or measured by a real runtime.
    pub duration: Nanos,
    /// How soon after its start the next micro-batch may start, when several may be in
    /// flight (pipeline parallelism: the first stage's share of the step); 0 when the
    /// backend cannot overlap steps (the next starts when this one ends).
    pub interval: Nanos,
    /// Tokens per `SeqWork` with `sample == true`, in plan order: `num_samples` for
    /// prefill and decode work, `accepted + 1` for verify work (the accepted drafts, then
    /// the model's own token).
    pub sampled: Vec<u32>,
    /// Accepted drafts of each verify work, in plan order.
    pub accepted: Vec<u32>,
    /// Model bandwidth utilisation (0 when unknown).
    pub mbu: f64,
    /// Model FLOPs utilisation (0 when unknown).
    pub mfu: f64,
    /// The log-probabilities of the `sampled` tokens, one per token (`None` for works that
    /// did not ask, [`crate::request::SamplingParams::logprobs`]); empty when no work of
    /// the step asked, or the backend draws no real tokens.
    pub logprobs: Vec<Option<TokenLogprobs>>,
}

/// One drawn token's log-probabilities (vLLM's `logprobs`): the log-softmax of the model's
/// raw logits (before temperature, top-k/top-p and masks, vLLM's `raw_logprobs`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenLogprobs {
    /// The drawn token's.
    pub logprob: f32,
    /// The most likely tokens' `(id, logprob)`, most likely first (lower id first on ties).
    pub top: Vec<(u32, f32)>,
}

impl StepOutcome {
    /// An outcome of `duration` with a placeholder token for every sample `plan` asks for
    /// and synthetic acceptances for its verify work (what a simulated backend returns).
    pub fn simulated(plan: &StepPlan, duration: Nanos) -> Self {
        let accepted = simulated_acceptances(plan);
        StepOutcome {
            duration,
            interval: 0,
            sampled: vec![crate::backend::SIM_TOKEN; Self::expected_samples(plan, &accepted)],
            accepted,
            mbu: 0.0,
            mfu: 0.0,
            logprobs: Vec::new(),
        }
    }

    /// The length `sampled` must have for `plan` with these verify acceptances.
    pub fn expected_samples(plan: &StepPlan, accepted: &[u32]) -> usize {
        plan.num_samples() + accepted.iter().map(|&a| a as usize + 1).sum::<usize>()
    }
}

/// The synthetic acceptance of each verify work of `plan` ([`crate::spec::simulated_accepted`]).
pub fn simulated_acceptances(plan: &StepPlan) -> Vec<u32> {
    plan.work
        .iter()
        .filter(|w| w.kind == WorkKind::Verify)
        .map(|w| {
            w.drafts.as_ref().map_or(0, |d| {
                crate::spec::simulated_accepted(d, &w.sampling, w.seq, w.start)
            })
        })
        .collect()
}
