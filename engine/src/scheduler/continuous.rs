//! Iteration-level batching, prefill first (Orca, vLLM V0 without chunked prefill).

use super::{Proposal, Queues, SchedulePolicy, SchedulerConfig};
use crate::block_manager::{EntryKind, ReserveOrder};

/// Each step either prefills whole prompts of waiting requests (whenever at least one fits)
/// or decodes every running sequence; when blocks run out during decode, the newest
/// admitted sequence is preempted (recompute or swap). Swapped-out sequences are swapped
/// back in during decode steps, before any new prompt is prefilled.
#[derive(Debug, Default, Clone, Copy)]
pub struct Continuous;

impl SchedulePolicy for Continuous {
    fn name(&self) -> &'static str {
        "continuous"
    }

    fn propose(&mut self, q: &Queues<'_>, cfg: &SchedulerConfig) -> Proposal {
        let mut p = Proposal {
            order: Some(ReserveOrder::WaitingFirstExclusive),
            ..Proposal::default()
        };
        let mut budget = cfg.max_num_batched_tokens;
        // Swapped-out sequences resume before any new prefill, in a decode step after the
        // running ones (vLLM V0: no prefills while the swapped queue is non-empty).
        if q.waiting.front().is_some_and(|&id| q.seq(id).swapped) {
            p.order = Some(ReserveOrder::RunningFirst);
            for &id in q.running {
                let s = q.seq(id);
                p.push(id, EntryKind::Running, s.remaining(), s.num_tokens);
            }
            for id in q.seated(cfg.max_num_seqs) {
                let s = q.seq(id);
                if !s.swapped {
                    break;
                }
                p.push(id, EntryKind::Waiting, s.remaining(), s.num_tokens);
            }
            return p;
        }
        for id in q.seated(cfg.max_num_seqs) {
            let s = q.seq(id);
            let n = s.remaining();
            if n > budget {
                break;
            }
            budget -= n;
            p.push(id, EntryKind::Waiting, n, s.num_tokens);
        }
        for &id in q.running {
            let s = q.seq(id);
            p.push(id, EntryKind::Running, s.remaining(), s.num_tokens);
        }
        p
    }
}
