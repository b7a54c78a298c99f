//! Chunked prefill (vLLM V1, Sarathi-Serve), optionally with TensorRT-LLM's batch waiting,
//! or mixed batches of whole prompts and decodes (`chunked_prefill = false`), or SGLang's
//! mixed chunks (`max_prefill_tokens`).

use super::{Proposal, Queues, SchedulePolicy, SchedulerConfig};
use crate::block_manager::{EntryKind, ReserveOrder};

/// One token budget per step: running sequences first (a decode costs one token, an
/// unfinished prefill takes what is left of the budget), then waiting requests in FCFS
/// order, their prompts split into chunks that fit (or, without chunked prefill, whole
/// prompts up to the first whose uncached tokens do not fit; or, under SGLang's
/// `max_prefill_tokens`, a first prompt and then whole ones that fit it). New requests are admitted only in
/// steps without preemption. Under [`super::BatchWait`], new prompts that would join
/// decodes wait until enough gather or enough steps pass.
#[derive(Debug, Default, Clone, Copy)]
pub struct Chunked {
    /// Steps the waiting prompts have been held back so far (batch waiting).
    waited: u32,
}

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
        let mut decodes = false;
        let mut prefills = false;
        for &id in q.running {
            if budget == 0 {
                break;
            }
            let s = q.seq(id);
            decodes |= s.is_decode();
            prefills |= !s.is_decode();
            let n = s.remaining().min(budget);
            budget -= n;
            p.push(id, EntryKind::Running, n, s.num_computed + n);
        }
        let running = p.entries.len();
        // SGLang's mixed chunks: what is left of `max_prefill_tokens` for new prompts.
        let mut room = cfg
            .max_prefill_tokens
            .map(|m| m.saturating_sub(cfg.max_num_batched_tokens - budget));
        for id in q.seated(cfg.max_num_seqs) {
            if budget == 0 {
                break;
            }
            let s = q.seq(id);
            if let Some(r) = room.as_mut() {
                if prefills && s.remaining() >= *r {
                    break;
                }
                *r = r.saturating_sub(s.remaining().min(budget));
            }
            prefills = true;
            let n = s.remaining().min(budget);
            budget -= n;
            p.push(id, EntryKind::Waiting, n, s.num_computed + n);
            if !cfg.chunked_prefill && n < s.remaining() {
                // Whole prompts only: this one is admitted only if the prefix cache holds
                // what does not fit (the block manager decides, and a refusal ends the
                // step's admissions, FCFS); the budget is spent either way.
                if let Some(e) = p.entries.last_mut() {
                    e.whole = true;
                }
            }
        }
        if let Some(wait) = &cfg.batch_wait {
            // TensorRT-LLM decides per step, and only while something decodes (else the
            // prompts would wait for nothing).
            if decodes && p.entries.len() > running {
                let tokens = cfg.max_num_batched_tokens - budget;
                if wait.releases(self.waited, tokens, cfg.max_num_batched_tokens) {
                    self.waited = 0;
                } else {
                    self.waited += 1;
                    p.entries.truncate(running);
                    p.tokens.truncate(running);
                }
            }
        }
        p
    }
}
