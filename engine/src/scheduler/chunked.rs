//! Chunked prefill (vLLM V1, Sarathi-Serve).

use super::{Proposal, Queues, SchedulePolicy, SchedulerConfig};
use crate::block_manager::{EntryKind, ReserveOrder};

/// One token budget per step: running sequences first (a decode costs one token, an
/// unfinished prefill takes what is left of the budget), then waiting requests in FCFS
/// order, their prompts split into chunks that fit. New requests are admitted only in
/// steps without preemption.
#[derive(Debug, Default, Clone, Copy)]
pub struct Chunked;

impl SchedulePolicy for Chunked {
    fn name(&self) -> &'static str {
        "chunked"
    }

    fn propose(&mut self, q: &Queues<'_>, cfg: &SchedulerConfig) -> Proposal {
        let mut p = Proposal {
            order: Some(ReserveOrder::RunningFirst),
            ..Proposal::default()
        };
        let mut budget = cfg.max_num_batched_tokens;
        for &id in q.running {
            if budget == 0 {
                break;
            }
            let s = q.seq(id);
            let n = s.remaining().min(budget);
            budget -= n;
            p.push(id, EntryKind::Running, n, s.num_computed + n);
        }
        for id in q.seated(cfg.max_num_seqs) {
            if budget == 0 {
                break;
            }
            let s = q.seq(id);
            let n = s.remaining().min(budget);
            budget -= n;
            p.push(id, EntryKind::Waiting, n, s.num_computed + n);
        }
        p
    }
}
