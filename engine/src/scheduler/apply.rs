//! Step 2 of a scheduler step ([`Scheduler::apply`]): the block manager's answer turned
//! into the [`StepPlan`]: preempted sequences back to the front of the queue, granted ones
//! admitted (prefix-cache hits counted as computed), and each sequence's work.

use super::*;

impl Scheduler {
    /// Step 2: turns the block manager's answer into the step plan.
    pub fn apply(
        &mut self,
        req: &ReserveRequest,
        mut resp: ReserveResponse,
        now: Nanos,
    ) -> StepPlan {
        // SGLang's estimate decays each step and resets after a preemption.
        let (init, min, decay) = policy::NEW_TOKEN_RATIO;
        self.new_token_ratio = if resp.preempted.is_empty() {
            (self.new_token_ratio - decay).max(min)
        } else {
            init
        };
        if resp.deferred {
            // A running entry waits for blocks only the steps in flight can give: let them
            // drain (`propose` ends the drain once none is left).
            self.draining = true;
        }
        if !resp.preempted.is_empty() {
            self.requeue_preempted(&resp);
        }
        for &(id, hit) in &resp.probe_hits {
            if let Some(s) = self.seqs.get_mut(&id) {
                s.probed_prefix = hit;
            }
        }
        let mut tables = std::mem::take(&mut resp.tables).into_iter();
        let mut work = Vec::with_capacity(resp.granted.len());
        let mut recomputed = 0;
        for (k, &g) in resp.granted.iter().enumerate() {
            let hit = resp.hits.get(k).copied().unwrap_or(0);
            if let Some(w) = self.grant(&req.entries[g], g, hit, now, &mut tables, &mut recomputed)
            {
                work.push(w);
            }
        }
        self.plan(work, resp, recomputed, now)
    }

    /// Preempted sequences: recompute ones drop their computed tokens, swapped ones keep
    /// them; all return to the front of the queue (victims come newest first, so
    /// prepending each leaves the oldest at the head) and leave the running set.
    fn requeue_preempted(&mut self, resp: &ReserveResponse) {
        for &v in &resp.preempted {
            if let Some(s) = self.seqs.get_mut(&v) {
                s.status = SeqStatus::Preempted;
                // Swapped blocks come back as new GPU blocks: their hashes are offered
                // to the prefix cache again after the swap-in.
                s.hashed_blocks = 0;
                s.num_preemptions += 1;
                if resp.swapped.contains(&v) {
                    s.swapped = true;
                } else {
                    s.recompute_upto = s.recompute_upto.max(s.num_computed);
                    s.num_computed = 0;
                    s.shared_tokens = 0;
                }
            }
            self.waiting.push_front(v);
        }
        let pre = &resp.preempted;
        self.running.retain(|id| !pre.contains(id));
        // The FCFS check restarts after a preemption: re-admissions are legitimate.
        self.last_admitted_arrival = None;
    }

    /// A granted entry (`g`, its index in the request): a waiting sequence is admitted
    /// (joins the running set, its first scheduling recorded), a prefix-cache hit counts as
    /// computed, and the sequence takes the next block table. Returns its work in this step
    /// (`None`: not live, or admitted without computing yet). One lookup of the sequence:
    /// this runs per step and sequence.
    fn grant(
        &mut self,
        entry: &ReserveEntry,
        g: usize,
        hit: u32,
        now: Nanos,
        tables: &mut impl Iterator<Item = Vec<u32>>,
        recomputed: &mut u32,
    ) -> Option<SeqWork> {
        let mut tokens = self.pending_tokens[g];
        if entry.kind == EntryKind::Waiting {
            // Granted waiting entries are a prefix of the queue (no skipping), behind
            // only the sequences preempted in this very step (priority preemption).
            if let Some(pos) = self.waiting.iter().position(|&id| id == entry.seq) {
                self.waiting.remove(pos);
            }
            self.running.push(entry.seq);
        }
        let s = self.seqs.get_mut(&entry.seq)?;
        if hit > 0 {
            // Prefix-cache hit: those tokens are already in the KV cache.
            s.num_computed = hit;
            s.hashed_blocks = hit / self.cfg.block_size;
            tokens = tokens.min(s.num_tokens - hit);
            if s.first_scheduled.is_none() {
                s.cached_tokens = hit;
            }
        }
        if entry.kind == EntryKind::Waiting {
            s.status = SeqStatus::Running;
            s.swapped = false;
            s.admitted_seq = self.admissions;
            self.admissions += 1;
            if s.first_scheduled.is_none() {
                s.first_scheduled = Some(now);
                let key = (s.request.arrival, s.request.id);
                if self.cfg.queue == QueuePolicy::Fcfs {
                    if let Some(last) = self.last_admitted_arrival {
                        if key < last {
                            self.fcfs_violations += 1;
                        }
                    }
                    self.last_admitted_arrival = Some(key);
                }
            }
        }
        let table = tables.next().unwrap_or_default();
        if tokens == 0 {
            // Admitted (blocks reserved) but not computing in this step.
            return None;
        }
        let drafts = self.pending_drafts.get(g).cloned().flatten();
        let start = s.num_computed;
        *recomputed += s.recompute_upto.min(start + tokens).saturating_sub(start);
        Some(seq_work(
            s,
            entry.seq,
            tokens,
            drafts,
            self.cfg.keep_tokens,
            table,
            self.cfg.eos_token,
        ))
    }

    /// The step plan of `work`, with the block manager's moves, and the step's statistics.
    fn plan(
        &mut self,
        work: Vec<SeqWork>,
        resp: ReserveResponse,
        recomputed: u32,
        now: Nanos,
    ) -> StepPlan {
        // Tokens the running sequences hold once this step has run (fragmentation metric).
        let seqs = &self.seqs;
        let kv_tokens = self
            .running
            .iter()
            .filter_map(|id| seqs.get(id))
            .map(|s| {
                // Full blocks a forked sequence shares with its parent count once.
                u64::from(
                    self.cfg
                        .held_tokens(s.num_computed)
                        .saturating_sub(s.shared_tokens),
                )
            })
            .sum::<u64>()
            + work.iter().map(|w| u64::from(w.len)).sum::<u64>();
        self.last_prefilled = work.iter().any(|w| w.kind == WorkKind::Prefill);
        self.last_planned = !work.is_empty();
        self.last = StepStats {
            kv_tokens,
            recomputed_tokens: recomputed,
            num_swapped: resp.swapped.len() as u32,
            external_fragmentation: resp.external_fragmentation,
        };
        let padding = self.padding(&work);
        if self.cfg.max_concurrent_batches > 1 {
            // Held until the step's commit (steps planned meanwhile leave them out).
            for w in &work {
                if let Some(s) = self.seqs.get(&w.seq) {
                    self.in_flight.insert(s.request.id);
                }
            }
        }
        let plan = StepPlan {
            padding,
            step: self.steps,
            start: now,
            work,
            preempted: resp.preempted,
            swap_in: resp.swap_in,
            swap_out: resp.swap_out,
            block_copies: resp.block_copies,
            offload_loads: resp.offload_loads,
            disk_loads: resp.disk_loads,
            // The driver sets it for a rank of an attention-DP group.
            moe_group_tokens: None,
        };
        self.steps += 1;
        plan
    }
}

/// The work of sequence `s` in a step: `tokens` from its computed position (a verify when
/// it has drafts, else a decode or a prefill chunk), with its block table and, for real
/// backends, its token ids.
#[inline]
fn seq_work(
    s: &Sequence,
    seq: SeqId,
    tokens: u32,
    drafts: Option<crate::spec::Drafts>,
    keep_tokens: bool,
    block_table: Vec<u32>,
    eos: Option<u32>,
) -> SeqWork {
    let kind = if drafts.is_some() {
        WorkKind::Verify
    } else if s.is_decode() {
        WorkKind::Decode
    } else {
        WorkKind::Prefill
    };
    let mut token_ids: Vec<u32> = if keep_tokens {
        (s.num_computed..s.num_computed + tokens)
            .map_while(|p| s.token_at(p))
            .collect()
    } else {
        Vec::new()
    };
    if let Some(d) = drafts.as_ref().filter(|_| keep_tokens) {
        // The last token, then the engine's drafts (none: the backend drafts).
        token_ids.extend_from_slice(&d.tokens);
    }
    let sample = drafts.is_some() || s.num_computed + tokens == s.num_tokens;
    // min_tokens: the draws that would leave the request short of them mask its stops
    // (real backends only: simulated draws are placeholders).
    let (suppress, suppress_rows) = if sample && keep_tokens {
        let ids = s.request.suppressed(s.output_len, eos);
        let rows = s.request.min_tokens.saturating_sub(s.output_len);
        (ids, rows)
    } else {
        (Vec::new(), 0)
    };
    let suppress_rows = if suppress.is_empty() {
        0
    } else {
        suppress_rows
    };
    SeqWork {
        seq,
        kind,
        start: s.num_computed,
        len: tokens,
        sample,
        // The prompt's last position samples all `n` first tokens (the fork).
        num_samples: if s.output_len == 0 {
            s.request.n.max(1)
        } else {
            1
        },
        block_table,
        token_ids,
        sampling: s.request.sampling,
        drafts,
        suppress,
        suppress_rows,
    }
}

impl Scheduler {
    /// The padding a padded static batch computes with `work` (`static_padding`): each
    /// prompt padded to the batch's longest, and in a decode step a pad row for each of the
    /// batch's rows (`n` per request) that computes nothing, and the padded context (the
    /// longest prompt plus the decode steps run) at which every row, live or pad, attends
    /// and holds its cache.
    fn padding(&mut self, work: &[SeqWork]) -> crate::plan::Padding {
        let mut pad = crate::plan::Padding::default();
        if !self.cfg.static_padding {
            return pad;
        }
        let seqs = &self.seqs;
        for id in &self.running {
            if let Some(s) = seqs.get(id) {
                let pad = &mut self.pad;
                pad.longest_prompt = pad.longest_prompt.max(s.request.prompt_len);
                // A request holds its `n` rows (parallel samples or beams) from admission,
                // whether or not its sequences have forked, run, or already finished.
                if pad.requests.insert(s.request.id) {
                    pad.rows += s.request.n.max(1);
                }
            }
        }
        for w in work.iter().filter(|w| w.kind == WorkKind::Prefill) {
            let end = w.context_len();
            if let Some(s) = seqs.get(&w.seq) {
                // The last chunk of a prompt shorter than the longest gets its pad tokens.
                if end == s.request.prompt_len && end < self.pad.longest_prompt {
                    pad.prefill.push((end, self.pad.longest_prompt - end));
                }
            }
        }
        let decoding: Vec<u32> = work
            .iter()
            .filter(|w| w.kind != WorkKind::Prefill)
            .map(|w| w.context_len())
            .collect();
        if let Some(&context) = decoding.iter().max() {
            // Rows the step does not compute for a live sequence: finished members (and
            // those preempted, which a padded batch would not have).
            let idle = self.pad.rows.saturating_sub(decoding.len() as u32);
            let padded = self.pad.longest_prompt + 1 + self.pad.decode_steps;
            pad.decode = vec![context.max(padded); idle as usize];
            pad.context = context.max(padded);
            self.pad.decode_steps += 1;
        }
        pad
    }
}
