//! Request-level (static) batching.

use super::{Proposal, Queues, SchedulePolicy, SchedulerConfig};
use crate::block_manager::{EntryKind, ReserveOrder};

/// Forms a batch of up to `max_num_seqs` requests only when the previous batch has fully
/// finished, and reserves KV for prompt + max_tokens of every member at admission (as
/// pre-PagedAttention systems did), so a batch never preempts. The batch's prompts are
/// prefilled first (whole prompts, as many per step as `max_num_batched_tokens` allows),
/// then all members decode together until the last one finishes; nobody joins mid-batch.
/// Members that finish early leave the batch (their slots idle until the batch ends); with
/// `static_padding` the step plan carries their pad rows and the prompts' padding
/// ([`crate::plan::Padding`]), which the cost model charges, as Hugging Face `generate`
/// computes them.
#[derive(Debug, Default, Clone, Copy)]
pub struct StaticBatch;

impl SchedulePolicy for StaticBatch {
    fn name(&self) -> &'static str {
        "static"
    }

    fn propose(&mut self, q: &Queues<'_>, cfg: &SchedulerConfig) -> Proposal {
        let mut p = Proposal {
            order: Some(ReserveOrder::RunningFirst),
            ..Proposal::default()
        };
        let mut budget = cfg.max_num_batched_tokens;
        if q.running.is_empty() && q.held_seats == 0 {
            // Form a new batch: admit (and reserve) every member now; prefill those whose
            // prompts fit this step's budget, the rest in the following steps.
            for id in q.seated(cfg.max_num_seqs) {
                let s = q.seq(id);
                let n = if s.remaining() <= budget {
                    s.remaining()
                } else {
                    0
                };
                budget -= n;
                let worst_case = s.request.prompt_len + s.request.max_tokens;
                p.push(id, EntryKind::Waiting, n, worst_case);
            }
            return p;
        }
        // Prefill phase while any member has more than its next token to compute (a prompt,
        // or the recompute of a preempted parallel-sampling child).
        let to_prefill = |s: &crate::request::Sequence| s.output_len == 0 || s.remaining() > 1;
        let prefilling = q.running.iter().any(|&id| to_prefill(q.seq(id)));
        for &id in q.running {
            let s = q.seq(id);
            if prefilling {
                // Prefill phase: whole prompts in batch order under the token budget.
                if to_prefill(s) && s.remaining() <= budget {
                    budget -= s.remaining();
                    p.push(id, EntryKind::Running, s.remaining(), s.num_tokens);
                }
            } else {
                p.push(id, EntryKind::Running, s.remaining(), s.num_tokens);
            }
        }
        p
    }
}
