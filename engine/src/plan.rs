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
    /// Blocks to copy to the CPU pool first, before anything of the step reuses the GPU
    /// blocks they free, as `(gpu block, cpu block)`. A block shared by two preempted
    /// sequences is copied once for each.
    pub swap_out: Vec<(u32, u32)>,
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

    /// Tokens the backend must sample for this plan (the length of
    /// [`StepOutcome::sampled`]).
    pub fn num_samples(&self) -> usize {
        self.work
            .iter()
            .filter(|w| w.sample)
            .map(|w| w.num_samples as usize)
            .sum()
    }

    /// True when the plan moves KV blocks (swaps or copies) before its work.
    pub fn has_transfers(&self) -> bool {
        !self.swap_in.is_empty() || !self.swap_out.is_empty() || !self.block_copies.is_empty()
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
    /// `num_samples` sampled tokens per `SeqWork` with `sample == true`, in plan order.
    pub sampled: Vec<u32>,
    /// Model bandwidth utilisation (0 when unknown).
    pub mbu: f64,
    /// Model FLOPs utilisation (0 when unknown).
    pub mfu: f64,
}

impl StepOutcome {
    /// An outcome of `duration` with a placeholder token for every sample `plan` asks for
    /// (what a simulated backend returns).
    pub fn simulated(plan: &StepPlan, duration: Nanos) -> Self {
        StepOutcome {
            duration,
            sampled: vec![crate::backend::SIM_TOKEN; plan.num_samples()],
            mbu: 0.0,
            mfu: 0.0,
        }
    }
}
